"""A process that dies: :class:`Killed`, raised where a test kills the job."""

from __future__ import annotations

__all__ = ["Killed"]


class Killed(BaseException):
    """The process died here (a BaseException: no ``except Exception`` of the code under test catches it)."""
