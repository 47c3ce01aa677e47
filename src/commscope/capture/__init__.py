"""Recording the communication of real torch.distributed runs (extra: torch).

    import commscope.capture
    with commscope.capture.record("logs/"):
        train()
"""

from commscope.capture.recorder import RankLog, install_from_env, record, start, step, stop

__all__ = ["RankLog", "install_from_env", "record", "start", "step", "stop"]
