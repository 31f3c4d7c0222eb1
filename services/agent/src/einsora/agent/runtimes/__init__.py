"""Endpoint runtimes: what serves a model (llama.cpp, vLLM, MLX, a user's command, or the sim
endpoint), which of them this machine can serve, and the model file each one loads."""
