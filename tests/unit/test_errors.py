from __future__ import annotations

import psycopg
import psycopg_pool

from conveyor import errors
from conveyor.db import execute
from conveyor.protocols.rest import render


def test_sqlstates_map_to_the_tree():
    assert errors.ConveyorError.for_sqlstate("CVQ01") is errors.QueueNotFound
    assert errors.ConveyorError.for_sqlstate("CVM01") is errors.MessageTooLarge
    assert errors.ConveyorError.for_sqlstate("22P02") is errors.DataException  # by class
    assert errors.ConveyorError.for_sqlstate("42501") is errors.PermissionDenied
    assert errors.ConveyorError.for_sqlstate("XX000") is None
    assert errors.ConveyorError.for_sqlstate(None) is None


def test_driver_errors_are_translated():
    assert isinstance(execute.translate(psycopg.OperationalError("no route")), errors.Unavailable)
    assert isinstance(execute.translate(psycopg_pool.PoolTimeout("full")), errors.Unavailable)
    assert isinstance(execute.translate(psycopg.DataError("NUL")), errors.InvalidInput)
    internal = execute.translate(psycopg.ProgrammingError("syntax"))
    assert isinstance(internal, errors.InternalError) and "syntax" not in internal.message


def test_every_error_class_has_an_http_status():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for cls in subclasses(errors.ConveyorError):
        status = render.status_of(cls("x"))
        assert 400 <= status < 600, cls
    assert render.status_of(errors.QueueNotFound("x")) == 404
    assert render.status_of(errors.MessageTooLarge("x")) == 413
    assert render.status_of(errors.Unavailable("x")) == 503
