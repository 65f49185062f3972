"""The certificate that verifies envelope signatures, served at
``/SimpleNotificationService.pem`` (the envelopes' SigningCertURL) and ``/v1/cert``.

It comes from the signing key stored in the database, so it is the same from every server
process and across restarts; the first fetch on a new database creates the key.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from conveyor.core import signing

MEDIA_TYPE = "application/x-pem-file"


async def certificate(request: Request) -> Response:
    async with request.app.state.broker.connection() as conn:
        pem = await signing.certificate(conn)
        if pem is None:
            pem = (await signing.load_or_create(conn)).certificate_pem
    return Response(pem, media_type=MEDIA_TYPE, headers={"Cache-Control": "public, max-age=3600"})
