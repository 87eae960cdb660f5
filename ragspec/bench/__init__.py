"""`ragspec bench` and `ragspec bench-engine`: the speed benchmarks (runner, engine), their
summary and plots, the question sets and prompts (questions, prepare), the real-document corpora
(realdocs), the server's load test (load_test) and soak (soak), the GPU check (gpu_check); the
other engines they are measured against live in anchors/."""
