"""The attack runs' one-line error, in a module of its own (plain Python): the implementations' table, which
attack.py's schema reads before torch loads, raises it too."""

from rgb.core.errors import UserError


class AttackRunError(UserError, RuntimeError):
    """A one-line problem with an attack run: bad settings, a directory made for another run, missing shards."""
