"""The certificate that verifies envelope signatures, served at
``/SimpleNotificationService-<digest>.pem`` (the envelopes' SigningCertURL, named as AWS
names its certificates), ``/SimpleNotificationService.pem`` and ``/v1/cert``.

It comes from the signing key stored in the database, so it is the same from every server
process and across restarts; the first fetch on a new database creates the key.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from conveyor.core import signing

MEDIA_TYPE = "application/x-pem-file"


async def certificate(request: Request) -> Response:
    """The certificate; asked for by its digest (``/SimpleNotificationService-<digest>.pem``,
    the envelopes' SigningCertURL), only the certificate of that digest: a subscriber that
    verifies with it checks the key that signed."""
    async with request.app.state.broker.connection() as conn:
        pem = await signing.certificate(conn)
        if pem is None:
            pem = (await signing.load_or_create(conn)).certificate_pem
    digest = request.path_params.get("digest")
    if digest is not None and digest != signing.Signer.digest_of(pem):
        return Response("Not Found", status_code=404, media_type="text/plain")
    return Response(pem, media_type=MEDIA_TYPE, headers={"Cache-Control": "public, max-age=3600"})
