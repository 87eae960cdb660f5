"""`ragspec bench`: the speed benchmark, its summary and plots, and the llama.cpp anchor."""
