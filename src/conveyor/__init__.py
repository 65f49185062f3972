"""Conveyor: a PostgreSQL-native message broker."""

from importlib import metadata

try:
    __version__ = metadata.version("conveyor")
except metadata.PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"
