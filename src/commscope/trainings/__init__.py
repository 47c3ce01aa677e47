"""Reference trainings with PyTorch's own parallelism: ``commscope workload gpt|moe``."""
