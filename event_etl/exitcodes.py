"""The exit codes of every ``event-etl`` command: one table, so a script can branch on them.

A scheduler needs to tell "try again later" from "fix something" without reading messages.
Every command uses this one table (``--help`` of each command shows it, and so does the
README); a command uses the codes that apply to it.

====  ====================  ================================================================
code  name                  meaning
====  ====================  ================================================================
0     ``OK``                done: complete, verified, audited; a job stopped as asked
1     ``ERROR``             failed: the job (or the command) failed; the ``error:`` line says
                            why. A restart of a job on the same checkpoint loses nothing
2     ``USAGE``             usage or configuration error, nothing was started: a bad option
                            or HOUR, an unknown or broken event type, a missing extra, an
                            hour before the job's first (no marker will ever come)
3     ``NOT_COMPLETE``      not yet: the hour is not complete (timeout; ``cat``/``verify`` of
                            an hour without its marker; an ``audit`` that cannot be final
                            yet): try again later
4     ``COULD_NOT_CHECK``   the sink could not be read (network, permission, credentials, a
                            file where a folder should be): its state is unknown, not absent
5     ``FAILED``            verification failed, audit mismatch, a damaged marker or file
6     ``NO_DATA``           nothing at all under ``<sink>/<event_type>/``: a wrong ``--sink``
                            (or ``$EVENT_ETL_SINK``) or event type, or no job ever wrote there
7     ``BUSY``              another job already writes this type to this sink, or uses this
                            checkpoint (``run``, ``submit``)
129   ``HANGUP``            stopped at once by SIGHUP (``wait``)
130   ``INTERRUPTED``       stopped at once by Ctrl-C (a second one for ``run``/``publish``)
143   ``TERMINATED``        stopped at once by SIGTERM (a second one for ``run``/``publish``)
====  ====================  ================================================================

Codes 0 to 5 are those of release 0.1.0's consumer commands, unchanged.  Release 0.1.0's
``run`` exited 3 when another job held the lease; that is now 7 (3 means "not yet" for every
command).
"""

from __future__ import annotations

import enum

__all__ = ["ExitCode", "EXIT_CODE_MEANINGS", "exit_codes_help", "exit_codes_markdown"]


class ExitCode(enum.IntEnum):
    """The exit codes of every command (see the module docstring)."""

    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_COMPLETE = 3
    COULD_NOT_CHECK = 4
    FAILED = 5
    NO_DATA = 6
    BUSY = 7
    HANGUP = 129
    INTERRUPTED = 130
    TERMINATED = 143


EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "done: complete, verified, audited; a job stopped as asked (Ctrl-C, SIGTERM, a drain)",
    ExitCode.ERROR: "failed: the error: line says why (a job restarted on its checkpoint loses nothing)",
    ExitCode.USAGE: "usage or configuration error, nothing started: bad option or HOUR, unknown or broken "
                    "event type, missing extra, hour before the job's first",
    ExitCode.NOT_COMPLETE: "not yet: hour not complete (timeout; audit not final yet): try again later",
    ExitCode.COULD_NOT_CHECK: "could not check the sink (network, permission, credentials): state unknown",
    ExitCode.FAILED: "verification failed, audit mismatch, damaged marker or file",
    ExitCode.NO_DATA: "nothing at all under <sink>/<event_type>/: wrong --sink or type, or never written",
    ExitCode.BUSY: "another job already writes this type to this sink or uses this checkpoint",
    ExitCode.HANGUP: "stopped at once by SIGHUP",
    ExitCode.INTERRUPTED: "stopped at once by Ctrl-C (a second one for run and publish)",
    ExitCode.TERMINATED: "stopped at once by SIGTERM (a second one for run and publish)",
}
"""What each exit code means, one line each (help texts, docs)."""


def exit_codes_help() -> str:
    """The table for a command's ``--help`` (click keeps the ``\\b`` paragraph as it is)."""
    return "\b\nExit codes (the same for every command):\n" + "\n".join(
        f"  {int(c):>3}  {m}" for c, m in EXIT_CODE_MEANINGS.items())


def exit_codes_markdown() -> str:
    """The table as Markdown (README, docs/commands.md)."""
    rows = ["| code | name | meaning |", "|---|---|---|"]
    rows += [f"| {int(c)} | `{c.name}` | {m.replace('<sink>/<event_type>/', '`<sink>/<event_type>/`')} |"
             for c, m in EXIT_CODE_MEANINGS.items()]
    return "\n".join(rows)
