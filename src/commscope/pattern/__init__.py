"""What is sent where: the first half of commscope.

    layout      rank <-> (pp, dp, cp, ep, tp) coordinates, process groups from an order string
    workload/   the CommOps of one iteration, per framework (Megatron, PyTorch DDP/FSDP2, MoE all-to-all)
    traffic     each CommOp decomposed by its collective algorithm into flows: the traffic matrix
    volumes     the same traffic of many configurations at once, in closed form

numpy and the standard library only.
"""
