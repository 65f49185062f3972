"""The webhook egress allowlist: parsing, which addresses count as public, resolution that
checks every address a name resolves to, and the aiohttp resolver that connects only to
checked addresses (real loopback HTTP and HTTPS servers on the other end), keeping the
host name for the Host header, SNI and certificate verification."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import socket
import ssl

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from conveyor import settings
from conveyor.server import egress, webhooks


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
    "224.0.0.1", "255.255.255.255", "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::",
])
def test_default_allows_no_internal_address(address):
    allowlist = egress.Allowlist.parse(settings.Settings().webhook_allow)
    assert allowlist.entries == ("public",)
    assert not allowlist.allows_address(ip(address))
    with pytest.raises(egress.Denied, match="not allowed by CONVEYOR_WEBHOOK_ALLOW"):
        allowlist.check_address(ip(address), "example.test")


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_default_allows_public_addresses(address):
    assert egress.Allowlist.parse("public").allows_address(ip(address))


# IPv6 forms that carry an IPv4 address a translator or tunnel delivers to: each one that
# leads to an internal address (loopback, the metadata service, a private network)
@pytest.mark.parametrize("address", [
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:5",  # NAT64, well-known prefix
    "64:ff9b:1::7f00:1", "64:ff9b:1::808:808", "64:ff9b:1:808:8:808::",  # NAT64, local use: never
    "2002:7f00:1::", "2002:a9fe:a9fe::1", "2002:c0a8:101::",  # 6to4
    "::127.0.0.1", "::169.254.169.254", "::10.0.0.1",  # IPv4-compatible
    "::ffff:0:127.0.0.1", "::ffff:0:169.254.169.254", "::ffff:0:192.168.1.1",  # SIIT (IPv4-translated)
    "2001:0:7f00:1::f7ff:fffe", "2001:0:808:808::3f57:fefe",  # Teredo: server 127.0.0.1, or client 192.168.1.1
    "fec0::1", "fec0:1:2:3::4", "feff::1",  # site-local (deprecated)
])
def test_public_judges_the_ipv4_address_an_ipv6_address_carries(address):
    allowlist = egress.Allowlist.parse("public")
    assert not allowlist.allows_address(ip(address))
    with pytest.raises(egress.Denied, match="not allowed by CONVEYOR_WEBHOOK_ALLOW"):
        allowlist.check_address(ip(address), "example.test")


def test_a_public_ipv4_address_behind_nat64_stays_allowed():
    assert egress.Allowlist.parse("public").allows_address(ip("64:ff9b::808:808"))
    with pytest.raises(egress.Denied, match=r"64:ff9b::a9fe:a9fe \(which leads to 169.254.169.254\)"):
        egress.Allowlist.parse("public").check_address(ip("64:ff9b::a9fe:a9fe"), "64:ff9b::a9fe:a9fe")
    assert egress.Allowlist.parse("64:ff9b::/96").allows_address(ip("64:ff9b::7f00:1"))  # listed: the operator's call


def test_listing_replaces_the_default():
    allowlist = egress.Allowlist.parse("10.0.0.0/8, 127.0.0.1,hooks.example.com,*.corp.example")
    assert allowlist.allows_address(ip("10.9.8.7")) and allowlist.allows_address(ip("127.0.0.1"))
    assert allowlist.allows_address(ip("::ffff:10.0.0.1"))
    assert not allowlist.allows_address(ip("127.0.0.2")) and not allowlist.allows_address(ip("8.8.8.8"))
    assert allowlist.names_host("hooks.example.com") and allowlist.names_host("HOOKS.example.com.")
    assert allowlist.names_host("a.b.corp.example") and not allowlist.names_host("corp.example")
    assert not allowlist.names_host("example.com")
    nothing = egress.Allowlist.parse("none")
    assert not nothing.allows_address(ip("8.8.8.8")) and not nothing.names_host("hooks.example.com")


def test_settings_check_the_allowlist():
    assert settings.Settings.from_env({"CONVEYOR_WEBHOOK_ALLOW": "public, 10.0.0.0/8"}).webhook_allow == (
        "public", "10.0.0.0/8")
    for bad in ("10.0.0.0/33", "http://x", "a b", "*"):
        with pytest.raises(ValueError, match="CONVEYOR_WEBHOOK_ALLOW"):
            settings.Settings.from_env({"CONVEYOR_WEBHOOK_ALLOW": bad})
    with pytest.raises(ValueError):
        settings.Settings(webhook_timeout=0)


async def test_resolve_checks_every_address_of_a_name():
    # "localhost" resolves (from the hosts file) to loopback: 127.0.0.1, often ::1 too
    infos = await asyncio.get_running_loop().getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)
    addresses = {info[4][0] for info in infos}
    assert addresses and all(ip(a).is_loopback for a in addresses)
    with pytest.raises(egress.Denied, match=r"resolved from localhost"):
        await egress.resolve(egress.Allowlist.parse("public"), "localhost", 80)
    if len(addresses) > 1:  # every address must be allowed, not just one
        with pytest.raises(egress.Denied):
            await egress.resolve(egress.Allowlist.parse("127.0.0.1/32"), "localhost", 80)
    allowed = await egress.resolve(egress.Allowlist.parse("127.0.0.0/8,::1/128"), "localhost", 80)
    assert {r.address for r in allowed} == addresses
    named = await egress.resolve(egress.Allowlist.parse("localhost"), "localhost", 80)
    assert {r.address for r in named} == addresses  # a listed name is trusted whatever it resolves to


async def test_resolve_literals_and_failures():
    assert [r.address for r in await egress.resolve(egress.Allowlist.parse("127.0.0.1"), "127.0.0.1", 80)] == [
        "127.0.0.1"]
    with pytest.raises(egress.Denied, match=r"destination ::1 is not allowed"):
        await egress.resolve(egress.Allowlist.parse("127.0.0.1"), "[::1]", 80)
    with pytest.raises(egress.Denied):
        egress.check_literal(egress.Allowlist.parse("public"), "169.254.169.254")
    egress.check_literal(egress.Allowlist.parse("public"), "hooks.example.com")  # names are checked on resolve
    with pytest.raises(OSError):
        await egress.resolve(egress.Allowlist.parse("public"), "no-such-host.invalid", 80)


async def _serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_the_http_client_connects_only_to_checked_addresses():
    """A real request through the worker's session: a name that resolves to loopback is
    refused before any connection unless loopback is allowed; the Host header keeps the name."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server, port = await _serve(handler)
    async with server:
        denied = webhooks.Config(allowlist=egress.Allowlist.parse("10.0.0.0/8"))
        async with webhooks.session(denied) as http:
            with pytest.raises(egress.Denied):
                await http.post(f"http://localhost:{port}/x", data=b"")
        assert seen == []  # never connected
        allowed = webhooks.Config(allowlist=egress.Allowlist.parse("127.0.0.0/8,::1/128"))
        async with webhooks.session(allowed) as http, http.post(f"http://localhost:{port}/x", data=b"") as response:
            assert response.status == 204
        assert len(seen) == 1 and f"host: localhost:{port}".encode() in seen[0].lower()


def test_aiohttp_rejects_numeric_forms_that_would_dodge_the_check():
    """2130706433 is 127.0.0.1 to the socket layer; aiohttp refuses it, and were it passed
    to the resolver, the resolved address would be checked."""
    async def go() -> None:
        async with webhooks.session(webhooks.Config(allowlist=egress.Allowlist.parse("public"))) as http:
            with pytest.raises((aiohttp.InvalidURL, egress.Denied)):
                await http.post("http://2130706433:9/", data=b"")
    asyncio.run(go())


def _certificate(tmp_path, name: str) -> tuple[str, str]:
    """A self-signed certificate for the DNS name ``name`` (files: cert, key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


async def test_https_keeps_the_name_for_sni_and_certificate_checks(tmp_path):
    """The connection goes to the checked address, yet TLS is about the URL's host name:
    the server sees it as SNI and the certificate is verified against it."""
    cert_file, key_file = _certificate(tmp_path, "localhost")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert_file, key_file)
    names: list[str | None] = []
    server_tls.sni_callback = lambda sock, name, ctx: names.append(name)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    client_tls = ssl.create_default_context(cafile=cert_file)
    config = webhooks.Config(allowlist=egress.Allowlist.parse("127.0.0.0/8,::1/128"), tls=client_tls)
    async with server, webhooks.session(config) as http:
        async with http.post(f"https://localhost:{port}/", data=b"") as response:
            assert response.status == 200
        assert names == ["localhost"]
        # the same server by address: the certificate (for localhost) does not match
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await http.post(f"https://127.0.0.1:{port}/", data=b"")
