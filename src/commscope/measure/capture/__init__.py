"""Recording the communication of real torch.distributed runs (extra: torch).

    import commscope.measure.capture
    with commscope.measure.capture.record("logs/"):
        train()
"""

from commscope.measure.capture.recorder import RankLog, install_from_env, record, start, step, stop

__all__ = ["RankLog", "install_from_env", "record", "start", "step", "stop"]
