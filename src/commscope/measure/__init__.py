"""Measuring real runs and machines (the ``torch`` extra): the edge where commscope meets PyTorch.

    launch      forks local ranks from one parent (torch imported once)
    capture/    records every communication op of a torch.distributed job (a wrapping process group)
    bench/      nccl-tests-style sweeps, their fit into the bandwidth model, a machine's and a GPU's calibration
    tune/       the same harness per backend: the best backend per op and message size (MCR-DL)
"""
