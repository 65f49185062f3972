"""Where webhook deliveries may go: the destination allowlist (``CONVEYOR_WEBHOOK_ALLOW``).

A subscriber chooses the URL the server POSTs to, so without a check anyone who may
subscribe could make the server reach addresses only it can reach (a metadata service,
the database, an admin port on loopback). The allowlist is a comma-separated list of:

* ``public`` — any globally routable address (not private, loopback, link-local,
  shared/CGNAT, multicast, reserved or unspecified; IPv4-mapped IPv6 judged as IPv4).
  An IPv6 address that carries an IPv4 address for a translator or tunnel to reach
  (``_embedded``: NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo ``2001::/32``,
  IPv4-compatible ``::a.b.c.d``, SIIT ``::ffff:0:a.b.c.d``) is public only if what it
  carries is too; NAT64's local-use ``64:ff9b:1::/48`` (not globally reachable, and where
  the IPv4 address sits in it depends on the operator's prefix length) and the deprecated
  site-local ``fec0::/10`` never are;
* an IP address or CIDR range (``10.1.0.0/16``, ``127.0.0.1``, ``fd00::/8``);
* a host name (``hooks.internal.example``) or every name under a domain
  (``*.internal.example``) — a listed name is allowed whatever it resolves to: the
  operator vouches for that name's DNS;
* ``none`` — nothing (outbound deliveries off).

The default is ``public``: deliveries reach the internet, never the server's own networks.
Listing anything replaces the default (add ``public`` to keep it).

The check happens after DNS resolution and before any connection: the host is resolved
here, every address it resolves to must be allowed, and the connection is made to one of
those checked addresses (the HTTP client is given them instead of resolving again), so a
name that answers differently a moment later — DNS rebinding — cannot swap in an internal
address. The Host header and, for HTTPS, SNI and certificate verification keep the
original name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from conveyor import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

PUBLIC = "public"
NONE = "none"


class Denied(Exception):
    """A destination the allowlist does not allow; the message says why."""


def _classify(entry: str) -> str | Network:
    """A checked entry (``settings.parse_allowlist``): a keyword, a network or a host name."""
    if entry in (PUBLIC, NONE):
        return entry
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return entry.rstrip(".")


@dataclass(frozen=True)
class Allowlist:
    public: bool = True
    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()  # "*.example.com" -> ".example.com"
    entries: tuple[str, ...] = field(default=(PUBLIC,))

    @classmethod
    def parse(cls, spec: str | Iterable[str]) -> Allowlist:
        """From ``CONVEYOR_WEBHOOK_ALLOW``'s text or its parsed entries; ValueError if invalid."""
        text = spec if isinstance(spec, str) else ",".join(spec)
        parsed = [_classify(e) for e in settings.parse_allowlist(text)]
        names = [p for p in parsed if isinstance(p, str) and p not in (PUBLIC, NONE)]
        return cls(
            public=PUBLIC in parsed,
            networks=tuple(p for p in parsed if not isinstance(p, str)),
            hosts=frozenset(n for n in names if not n.startswith("*.")),
            domains=tuple(n[1:] for n in names if n.startswith("*.")),
            entries=tuple(str(p) for p in parsed),
        )

    def names_host(self, host: str) -> bool:
        """Whether the host name itself is listed."""
        host = host.lower().rstrip(".")
        return host in self.hosts or any(host.endswith(d) for d in self.domains)

    def allows_address(self, address: Address) -> bool:
        address = _unmapped(address)
        if any(address in n for n in self.networks):
            return True
        return self.public and is_public(address)

    def check_address(self, address: Address, host: str) -> None:
        if not self.allows_address(address):
            via = "" if literal(host) is not None else f" (resolved from {host})"
            carried = _embedded(address) if isinstance(address, ipaddress.IPv6Address) else []
            leads = f" (which leads to {', '.join(map(str, carried))})" if carried else ""
            raise Denied(f"destination {address}{via}{leads} is not allowed by CONVEYOR_WEBHOOK_ALLOW "
                         f"({','.join(self.entries) or NONE})")


def _unmapped(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


# IPv6 ranges whose last 32 bits are an IPv4 address a translator reaches: NAT64's well-known
# prefix (RFC 6052), IPv4-compatible addresses (deprecated, RFC 4291) and SIIT's
# IPv4-translated ones (RFC 2765).
_LAST_32_BITS = tuple(ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "::/96", "::ffff:0:0:0/96"))
# Never public: NAT64 for local use (RFC 8215: not globally reachable; the IPv4 address sits
# at a place that depends on the prefix length the operator chose) and site-local (RFC 3879).
_NEVER_PUBLIC = tuple(ipaddress.IPv6Network(n) for n in ("64:ff9b:1::/48", "fec0::/10"))


def _embedded(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address leads to through a translator or tunnel."""
    if any(address in n for n in _LAST_32_BITS) and int(address) > 1:  # :: and ::1 are themselves
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)  # the Teredo server, and the client (de-obfuscated)
    return []


def is_public(address: Address) -> bool:
    """A globally routable unicast address, and so is every IPv4 address it carries."""
    address = _unmapped(address)
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in n for n in _NEVER_PUBLIC):
            return False
        if not all(is_public(v4) for v4 in _embedded(address)):
            return False
    return address.is_global and not address.is_multicast


def literal(host: str) -> Address | None:
    """The address a host that is an IP literal names (``[::1]`` too), else None."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


@dataclass(frozen=True)
class Resolved:
    family: int
    address: str


async def resolve(allowlist: Allowlist, host: str, port: int, family: int = socket.AF_UNSPEC) -> list[Resolved]:
    """Resolve ``host`` and check every address it resolves to: the addresses to connect
    to, or Denied. Resolution failures are OSError (socket.gaierror), as from the resolver."""
    address = literal(host)
    if address is not None:
        allowlist.check_address(address, host)
        return [Resolved(socket.AF_INET6 if address.version == 6 else socket.AF_INET, str(address))]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
    found: dict[str, Resolved] = {}
    for info_family, _, _, _, sockaddr in infos:
        found.setdefault(str(sockaddr[0]), Resolved(info_family, str(sockaddr[0])))
    if not found:
        raise socket.gaierror(socket.EAI_NONAME, f"{host} did not resolve to any address")
    if not allowlist.names_host(host):
        for item in found.values():
            allowlist.check_address(ipaddress.ip_address(item.address.split("%")[0]), host)
    return list(found.values())


def check_literal(allowlist: Allowlist, host: str) -> None:
    """Denied for a host that is a disallowed IP literal (the HTTP client does not resolve those)."""
    address = literal(host)
    if address is not None:
        allowlist.check_address(address, host)
