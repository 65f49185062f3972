"""Configuration: ``CONVEYOR_*`` environment variables (and ``DATABASE_URL``), overridable
by CLI flags. One frozen object, built once and passed down."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AUTH_MODES = ("none", "header", "token", "jwt")
ROLES = ("read", "write", "admin")
QUEEN_CREATE_ON_PUSH = ("any", "admin", "off")  # whose Queen pushes may create queues


FUSED_OPERATIONS = ("send", "receive", "delete", "push", "pop", "ack", "renew")


def parse_fusion_policies(value: str) -> dict[str, tuple[int, float]]:
    """``push=50/20,pop=20/5``: per operation, the preferred batch and the longest hold
    (milliseconds), as seed 004's QUEEN_<TYPE>_* settings."""
    found: dict[str, tuple[int, float]] = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        op, sep, rest = part.partition("=")
        size, slash, hold = rest.partition("/")
        if not sep or not slash or op.strip() not in FUSED_OPERATIONS:
            raise ValueError(f"expected op=size/hold_ms with op one of {', '.join(FUSED_OPERATIONS)}, got {part!r}")
        preferred, hold_ms = int(size), float(hold)
        if not 1 <= preferred <= 10000 or not 0 <= hold_ms <= 1000:
            raise ValueError(f"a preferred batch is 1 to 10000 and a hold 0 to 1000 ms, got {part!r}")
        found[op.strip()] = (preferred, hold_ms / 1000.0)
    return found


# dialect -> the schema it creates (also the name of the real extension it stands in for);
# installed by conveyor.db.migrate
DIALECTS = {"pgmq": "pgmq", "pgque": "pgque", "pgq": "pgq", "hq": "hq"}


def parse_dialects(value: str | None) -> tuple[str, ...]:
    """``"pgmq,pgq"`` -> ("pgmq", "pgq"), each checked (ValueError)."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in (value or "").split(",") if n.strip()))
    for name in names:
        if name not in DIALECTS:
            raise ValueError(f"unknown dialect {name!r}: choose from {', '.join(DIALECTS)}")
    return names


_KID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def parse_keys(spec: str) -> tuple[tuple[str, bytes], ...]:
    """``kid:base64key[,kid:base64key...]`` (CONVEYOR_ENCRYPTION_KEY): AES-256 keys by id,
    the first one sealing (conveyor.crypto)."""
    keys: dict[str, bytes] = {}
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        kid, sep, encoded = entry.partition(":")
        if not sep or not _KID.match(kid):
            raise ValueError("encryption keys look like KEY_ID:BASE64_32_BYTES[,...] (key ids: letters, digits, _ . -)")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"encryption key {kid!r} is not base64") from None
        if len(raw) != 32:
            raise ValueError(f"encryption key {kid!r} must be 32 bytes (AES-256), got {len(raw)}")
        if kid in keys:
            raise ValueError(f"encryption key id {kid!r} given twice")
        keys[kid] = raw
    if not keys:
        raise ValueError("no encryption key given")
    return tuple(keys.items())


def _bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {value!r}")


def parse_credentials(spec: str) -> dict[str, tuple[str, str]]:
    """``"AKID1:secret1,AKID2:secret2:read"`` -> {access key: (secret key, role)}; the role
    (read, write or admin) defaults to admin."""
    pairs: dict[str, tuple[str, str]] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, rest = item.partition(":")
        secret, _, role = rest.partition(":")
        if not sep or not key or not secret or (role and role not in ROLES):
            raise ValueError(f"AWS credentials look like ACCESS_KEY:SECRET_KEY[:{'|'.join(ROLES)}], "
                             f"got {key!r}:...")
        pairs[key] = (secret, role or "admin")
    return pairs


def parse_role_map(spec: str) -> dict[str, str]:
    """``"viewer:read,editor:write"`` -> {claim value: role} (JWT role claim values)."""
    found: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        value, sep, role = item.rpartition(":")
        if not sep or not value or role not in ROLES:
            raise ValueError(f"JWT roles look like CLAIM_VALUE:{'|'.join(ROLES)}, got {item!r}")
        found[value] = role
    return found


def read_key(value: str) -> str:
    """A PEM key given inline, or ``@/path/to/key.pem`` (or a plain path) to read it from."""
    if "-----BEGIN" in value:
        return value.replace("\\n", "\n")
    path = Path(value.removeprefix("@"))
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the key file {path}: {exc.strerror}") from None


def _inline_or_file(value: str) -> str:
    """A value given inline, or ``@/path`` to read it from a file (secrets kept out of the
    environment)."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read {value[1:]}: {exc.strerror}") from None


def encryption_keys(value: str) -> tuple[tuple[str, bytes], ...]:
    """CONVEYOR_ENCRYPTION_KEY as the server reads it: the keys inline, or ``@/path`` to a
    file holding them (also what the Spark data source ships to its executors)."""
    return parse_keys(_inline_or_file(value))


def parse_tokens(spec: str) -> dict[str, str]:
    """``"tok1:admin,tok2:read"`` -> {token: role}."""
    tokens: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        token, sep, role = item.rpartition(":")
        if not sep or not token or role not in ROLES:
            raise ValueError(f"auth token entries look like TOKEN:{'|'.join(ROLES)}, got {item!r}")
        tokens[token] = role
    return tokens


DEFAULT_WORKERS_CAP = 8  # the most server processes started without CONVEYOR_WORKERS


def usable_cores(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may run on: its CPU affinity (taskset, cpusets), lowered to
    a cgroup v2 CPU quota rounded up (a container's ``--cpus``, a Kubernetes CPU limit)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def default_workers() -> int:
    """Server processes when CONVEYOR_WORKERS is not set: one per usable core, at most
    DEFAULT_WORKERS_CAP (each holds a pool of up to CONVEYOR_POOL_MAX connections, and
    eight of 16 already take 128 of PostgreSQL's connections)."""
    return min(usable_cores(), DEFAULT_WORKERS_CAP)


_ALLOW_HOST = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?$")


def parse_allowlist(spec: str) -> tuple[str, ...]:
    """``"public,10.0.0.0/8,hooks.example.com,*.corp.example"`` -> entries, each checked
    (``public``, ``none``, an IP address or CIDR range, a host name or ``*.domain``)."""
    entries = tuple(e.strip().lower() for e in spec.split(",") if e.strip())
    for entry in entries:
        if entry in ("public", "none") or _ALLOW_HOST.match(entry):
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"webhook allowlist entries are public, none, an IP address, a CIDR range, "
                             f"a host name or *.domain; got {entry!r}") from None
    return entries


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    data_dir: Path | None = None
    host: str = "127.0.0.1"
    port: int = 9324
    # server processes sharing the port (conveyor.server.run): one per usable core, capped
    workers: int = field(default_factory=default_workers)
    pool_min: int = 2
    pool_max: int = 16
    migrate: bool = True
    dialects: tuple[str, ...] = ()  # installed (and then upgraded) by migrate (DIALECTS)
    auth_mode: str = "header"
    auth_tokens: Mapping[str, str] = field(default_factory=dict)
    # auth mode jwt (conveyor.protocols.jwt_tokens)
    jwt_secret: str | None = None
    jwt_public_key: str | None = None
    # encryption at rest (conveyor.crypto): queues flagged encrypted are sealed with it
    encryption_keys: tuple[tuple[str, bytes], ...] = ()  # (key id, 32 bytes); the first seals
    # the failover spool (conveyor.server.spool): off without a directory
    spool_dir: Path | None = None
    spool_max_bytes: int = 1 << 30
    spool_sqs: bool = False  # SQS sends spooled too (their MessageId is then promised from the spool)
    # OpenTelemetry (conveyor.tracing): off unless asked for
    tracing: bool = False
    tracing_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    tracing_sample_rate: float = 1.0
    jwt_algorithms: tuple[str, ...] = ()
    jwt_role_claim: str = "role"
    jwt_roles: Mapping[str, str] | None = None  # None: the default claim values
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_leeway: float = 0.0
    fusion: bool = True
    fusion_max_batch: int = 500
    fusion_max_inflight: int = 1  # calls in flight per key and process (the start, with vegas)
    fusion_concurrency: str = "static"  # or "vegas": adaptive calls in flight (server/fusion.py)
    fusion_vegas_max: int = 16
    # per operation (send, receive, delete, push, pop, ack, renew): hold for a preferred
    # batch size or a maximum time; by default a batch goes as soon as a slot is free
    fusion_policies: Mapping[str, tuple[int, float]] = field(default_factory=dict)  # op: (preferred, hold s)
    # admission control (docs/operations.md, "Overload"): what a process accepts before it
    # answers with the protocol's throttling error instead of queueing more
    fusion_max_pending: int = 10000  # messages (or receive slots) waiting in one fuser
    pool_max_waiting: int = 256  # requests waiting for a database connection
    max_requests: int = 4096  # requests in progress at once, long polls included
    max_request_bytes: int = 8 * 1024 * 1024
    # connections (server/connections.py; docs/operations.md, "Connections"): per process,
    # at most max_connections; one with no request started is closed after
    # http_idle_timeout seconds, one whose request headers are not complete
    # http_header_timeout seconds after their first byte is closed
    max_connections: int = 10000
    http_idle_timeout: float = 5.0
    http_header_timeout: float = 5.0
    max_wait_seconds: int = 20
    listen_seconds: int = 60
    poll_fallback_seconds: float = 1.0
    maintenance_interval: float = 60.0
    depth_scrape_interval: float = 15.0
    vacuum_interval: float = 1.0
    shutdown_timeout: float = 10.0
    # how long `serve` waits at start for a database that refuses connections (still
    # starting); a wrong URL, database, role or password fails at once (conveyor.db.reach)
    database_wait: float = 30.0
    log_level: str = "info"
    queen_port: int | None = None  # also serve on this port (Queen's default: 6632)
    # Queen's create-on-push (docs/queen.md, "Queues created by pushes"): which callers'
    # pushes may create the queues they name (any caller that may push, admin only, or
    # none), how many one push may create, and how many partitioned queues may exist before
    # pushes create none (0: no bound)
    queen_create_on_push: str = "any"
    queen_create_per_push: int = 10
    queen_create_max_queues: int = 10000
    hq_port: int | None = None  # also serve on this port, hq's API at its root (hq's default: 9999)
    log_format: str = "text"  # or "json": one JSON object per line (conveyor.logs)
    # a request still running after this many seconds is answered 408 (0: never); time a
    # long poll spends waiting for messages does not count
    request_timeout: float = 30.0
    stream_tick_interval: float = 0.5
    stream_maint_interval: float = 30.0
    # AWS protocols
    region: str = "us-east-1"
    account_id: str = "000000000000"
    base_url: str | None = None
    aws_credentials: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # key: (secret, role)
    # webhook deliveries (SNS HTTP/HTTPS subscriptions)
    webhook_allow: tuple[str, ...] = ("public",)
    webhook_timeout: float = 5.0
    webhook_batch: int = 50
    webhook_poll: float = 1.0
    # the scheduler (server/scheduler.py): poll period and rows claimed per pass
    schedule_enabled: bool = True
    schedule_poll_seconds: float = 1.0
    schedule_batch_size: int = 32
    # the dashboard's history (server/ui, core/history.py): a sample every interval, kept this long
    history_interval: float = 10.0
    history_retention: float = 86400.0

    def __post_init__(self) -> None:
        if self.auth_mode not in AUTH_MODES:
            raise ValueError(f"auth mode must be one of {', '.join(AUTH_MODES)}, got {self.auth_mode!r}")
        if self.auth_mode == "token" and not self.auth_tokens:
            raise ValueError("auth mode 'token' needs CONVEYOR_AUTH_TOKENS (TOKEN:ROLE,...)")
        if self.auth_mode == "jwt" and not (self.jwt_secret or self.jwt_public_key):
            raise ValueError("auth mode 'jwt' needs CONVEYOR_JWT_SECRET (HS256) or CONVEYOR_JWT_PUBLIC_KEY "
                             "(RS256, EdDSA)")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log format must be text or json, got {self.log_format!r}")
        if self.http_idle_timeout <= 0 or self.http_header_timeout <= 0:
            raise ValueError("the HTTP idle and header timeouts must be > 0 seconds")
        if self.max_connections < 16:
            raise ValueError(f"max_connections must be at least 16, got {self.max_connections}")
        if self.request_timeout < 0:
            raise ValueError(f"request timeout must be >= 0 seconds (0: none), got {self.request_timeout}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be from 1 to 65535, got {self.port}")
        if self.queen_port is not None and (not 1 <= self.queen_port <= 65535 or self.queen_port == self.port):
            raise ValueError(f"the Queen port must be from 1 to 65535 and not the server's port, got {self.queen_port}")
        if self.hq_port is not None:
            self._check_hq_port()
        if self.queen_create_on_push not in QUEEN_CREATE_ON_PUSH:
            raise ValueError(f"Queen's create-on-push must be one of {', '.join(QUEEN_CREATE_ON_PUSH)}, "
                             f"got {self.queen_create_on_push!r}")
        if not 1 <= self.queen_create_per_push <= 10000 or self.queen_create_max_queues < 0:
            raise ValueError("queues created per push must be from 1 to 10000, and the most queues pushes may "
                             "create up to at least 0 (0: no bound)")
        if not 1 <= self.workers <= 64:
            raise ValueError(f"workers must be from 1 to 64, got {self.workers}")
        if self.pool_min < 1 or self.pool_max < self.pool_min:
            raise ValueError("pool sizes need 1 <= pool_min <= pool_max")
        if not 0.0 <= self.tracing_sample_rate <= 1.0:
            raise ValueError(f"the tracing sample rate is from 0 to 1, got {self.tracing_sample_rate}")
        if self.fusion_concurrency not in ("static", "vegas"):
            raise ValueError(f"fusion concurrency must be static or vegas, got {self.fusion_concurrency!r}")
        if self.fusion_max_inflight < 1 or self.fusion_vegas_max < self.fusion_max_inflight:
            raise ValueError("fusion_max_inflight must be at least 1 and at most fusion_vegas_max")
        if self.fusion_max_pending < 1 or self.pool_max_waiting < 1 or self.max_requests < 1:
            raise ValueError("fusion_max_pending, pool_max_waiting and max_requests must be at least 1")
        if not re.fullmatch(r"[a-z0-9-]{1,32}", self.region):
            raise ValueError(f"region must look like us-east-1, got {self.region!r}")
        if not re.fullmatch(r"\d{12}", self.account_id):
            raise ValueError(f"account id must be 12 digits, got {self.account_id!r}")
        if self.webhook_timeout <= 0 or self.webhook_poll <= 0 or self.webhook_batch < 1:
            raise ValueError("webhook timeout and poll must be > 0 seconds and the batch at least 1")
        if self.schedule_poll_seconds <= 0 or not 1 <= self.schedule_batch_size <= 10000:
            raise ValueError("schedule poll must be > 0 seconds and the batch size from 1 to 10000")
        if self.history_interval <= 0 or self.history_retention < 60:
            raise ValueError("the history interval must be > 0 seconds and its retention at least 60 seconds")
        if not 0 <= self.vacuum_interval < math.inf:
            raise ValueError(f"the vacuum interval must be >= 0 seconds (0: none), got {self.vacuum_interval}")

    def _check_hq_port(self) -> None:
        """hq's port is a port of its own; hq's routes need the hq dialect, installed with it."""
        assert self.hq_port is not None
        if not 1 <= self.hq_port <= 65535 or self.hq_port in (self.port, self.queen_port):
            raise ValueError(f"the hq port must be from 1 to 65535 and not the server's or Queen's port, "
                             f"got {self.hq_port}")
        if "hq" not in self.dialects:
            object.__setattr__(self, "dialects", (*self.dialects, "hq"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from the environment, then ``overrides`` (None values are ignored)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, (var, parse) in _ENV.items():
            if var in env and env[var] != "":
                try:
                    values[name] = parse(env[var])
                except ValueError as exc:
                    raise ValueError(f"{var}: {exc}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


_ENV: dict[str, tuple[str, Any]] = {
    "database_url": ("DATABASE_URL", str),
    "data_dir": ("CONVEYOR_DATA_DIR", Path),
    "host": ("CONVEYOR_HOST", str),
    "port": ("CONVEYOR_PORT", int),
    "workers": ("CONVEYOR_WORKERS", int),
    "queen_port": ("CONVEYOR_QUEEN_PORT", int),
    "hq_port": ("CONVEYOR_HQ_PORT", int),
    "queen_create_on_push": ("CONVEYOR_QUEEN_CREATE_ON_PUSH", lambda v: v.strip().lower()),
    "queen_create_per_push": ("CONVEYOR_QUEEN_CREATE_PER_PUSH", int),
    "queen_create_max_queues": ("CONVEYOR_QUEEN_CREATE_MAX_QUEUES", int),
    "pool_min": ("CONVEYOR_POOL_MIN", int),
    "pool_max": ("CONVEYOR_POOL_MAX", int),
    "migrate": ("CONVEYOR_MIGRATE", _bool),
    "dialects": ("CONVEYOR_DIALECTS", parse_dialects),
    "auth_mode": ("CONVEYOR_AUTH", str),
    "auth_tokens": ("CONVEYOR_AUTH_TOKENS", parse_tokens),
    "jwt_secret": ("CONVEYOR_JWT_SECRET", str),
    "jwt_public_key": ("CONVEYOR_JWT_PUBLIC_KEY", read_key),
    "encryption_keys": ("CONVEYOR_ENCRYPTION_KEY", encryption_keys),
    "spool_dir": ("CONVEYOR_SPOOL_DIR", Path),
    "spool_max_bytes": ("CONVEYOR_SPOOL_MAX_BYTES", int),
    "spool_sqs": ("CONVEYOR_SPOOL_SQS", _bool),
    "tracing": ("CONVEYOR_TRACING", _bool),
    "tracing_endpoint": ("CONVEYOR_TRACING_ENDPOINT", str),
    "tracing_sample_rate": ("CONVEYOR_TRACING_SAMPLE_RATE", float),
    "jwt_algorithms": ("CONVEYOR_JWT_ALGORITHMS", lambda v: tuple(a.strip() for a in v.split(",") if a.strip())),
    "jwt_role_claim": ("CONVEYOR_JWT_ROLE_CLAIM", str),
    "jwt_roles": ("CONVEYOR_JWT_ROLES", parse_role_map),
    "jwt_audience": ("CONVEYOR_JWT_AUDIENCE", str),
    "jwt_issuer": ("CONVEYOR_JWT_ISSUER", str),
    "jwt_leeway": ("CONVEYOR_JWT_LEEWAY", float),
    "fusion": ("CONVEYOR_FUSION", _bool),
    "fusion_max_batch": ("CONVEYOR_FUSION_MAX_BATCH", int),
    "fusion_max_inflight": ("CONVEYOR_FUSION_MAX_INFLIGHT", int),
    "fusion_concurrency": ("CONVEYOR_FUSION_CONCURRENCY", str),
    "fusion_vegas_max": ("CONVEYOR_FUSION_VEGAS_MAX", int),
    "fusion_policies": ("CONVEYOR_FUSION_POLICY", lambda v: parse_fusion_policies(v)),
    "fusion_max_pending": ("CONVEYOR_FUSION_MAX_PENDING", int),
    "pool_max_waiting": ("CONVEYOR_POOL_MAX_WAITING", int),
    "max_requests": ("CONVEYOR_MAX_REQUESTS", int),
    "max_request_bytes": ("CONVEYOR_MAX_REQUEST_BYTES", int),
    "max_connections": ("CONVEYOR_MAX_CONNECTIONS", int),
    "http_idle_timeout": ("CONVEYOR_HTTP_IDLE_TIMEOUT", float),
    "http_header_timeout": ("CONVEYOR_HTTP_HEADER_TIMEOUT", float),
    "listen_seconds": ("CONVEYOR_LISTEN_SECONDS", int),
    "poll_fallback_seconds": ("CONVEYOR_POLL_FALLBACK_SECONDS", float),
    "maintenance_interval": ("CONVEYOR_MAINTENANCE_INTERVAL", float),
    "depth_scrape_interval": ("CONVEYOR_DEPTH_SCRAPE_INTERVAL", float),
    "vacuum_interval": ("CONVEYOR_VACUUM_INTERVAL", float),
    "shutdown_timeout": ("CONVEYOR_SHUTDOWN_TIMEOUT", float),
    "database_wait": ("CONVEYOR_DATABASE_WAIT", float),
    "log_level": ("CONVEYOR_LOG_LEVEL", str),
    "log_format": ("CONVEYOR_LOG_FORMAT", str),
    "request_timeout": ("CONVEYOR_REQUEST_TIMEOUT", float),
    "stream_tick_interval": ("CONVEYOR_STREAM_TICK_INTERVAL", float),
    "stream_maint_interval": ("CONVEYOR_STREAM_MAINT_INTERVAL", float),
    "region": ("CONVEYOR_REGION", str),
    "account_id": ("CONVEYOR_ACCOUNT_ID", str),
    "base_url": ("CONVEYOR_BASE_URL", lambda v: v.rstrip("/")),
    "aws_credentials": ("CONVEYOR_AWS_CREDENTIALS", parse_credentials),
    "webhook_allow": ("CONVEYOR_WEBHOOK_ALLOW", parse_allowlist),
    "webhook_timeout": ("CONVEYOR_WEBHOOK_TIMEOUT", float),
    "webhook_batch": ("CONVEYOR_WEBHOOK_BATCH", int),
    "webhook_poll": ("CONVEYOR_WEBHOOK_POLL", float),
    "schedule_enabled": ("CONVEYOR_SCHEDULE_ENABLED", _bool),
    "schedule_poll_seconds": ("CONVEYOR_SCHEDULE_POLL_SECONDS", float),
    "schedule_batch_size": ("CONVEYOR_SCHEDULE_BATCH_SIZE", int),
    "history_interval": ("CONVEYOR_HISTORY_INTERVAL", float),
    "history_retention": ("CONVEYOR_HISTORY_RETENTION", float),
}
