"""Thin commands: parse, call the library, write. See ``commscope --help``."""
