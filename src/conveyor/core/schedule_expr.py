"""Schedule expressions: parse the four shapes a schedule is written in, canonicalise them,
project fire times and describe them in words. Pure Python, no database.

The four shapes, exactly one per schedule:

- ``cron``: five fields (minute hour day-of-month month day-of-week) read in ``timezone``
  (an IANA name, default UTC); ``@hourly``, ``@daily``/``@midnight``, ``@weekly``,
  ``@monthly`` and ``@yearly``/``@annually`` stand for their usual expressions.
- ``every``: an interval such as ``30s``, ``5m``, ``2h``, ``1d``, ``1w`` (or ``5 minutes``)
  that a cron expression can say: seconds in whole minutes, minutes dividing an hour,
  hours dividing a day, one day, one week. Others are refused with the reason.
- ``when``: a small English form (the whole grammar is in ``_WHEN_FORMS`` and
  docs/schedules.md): ``hourly``, ``daily``, ``weekly``, ``monthly``, ``every minute``,
  ``every 15 minutes``, ``every day at 09:00``, ``every monday at 8am``, ``every weekday
  at 17:30``, ``every weekend at noon``, ``daily at 6pm``.
- ``fire_at``: one ISO 8601 instant (``2026-05-01T09:00:00Z``); without an offset it is
  read in ``timezone``.

Every shape becomes either a cron string plus time zone (kind ``cron``) or one UTC
instant (kind ``once``). Next-fire times come from cronsim, which follows Debian cron
across DST changes: a time that does not exist (02:30 on a spring-forward night) fires
at the first minute after the gap, and a time that happens twice fires once, except for
expressions that fire at least hourly, which fire in both repeated hours.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from collections import deque
from collections.abc import Iterator

import cron_descriptor
import cronsim

from conveyor import errors, types

UTC = dt.UTC
SHAPES = ("cron", "every", "when", "fire_at")
MAX_PREVIEW = 100
_MAX_SCAN = 10_000  # occurrences walked one by one before jumping closer to now

_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
_DAYS = {"sunday": 0, "monday": 1, "tuesday": 2, "wednesday": 3, "thursday": 4, "friday": 5, "saturday": 6}
_INTERVAL = re.compile(r"(\d{1,7})\s*([a-z]+)")


def _invalid(message: str) -> errors.InvalidInput:
    return errors.InvalidInput(message)


# -- time zones and instants ------------------------------------------------------------

def zone(name: str | None) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (None: UTC)."""
    name = "UTC" if name is None else name
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*", name) \
            or len(name) > 64:
        raise _invalid(f"unknown time zone {str(name)[:64]!r}: use an IANA name such as Europe/Paris or UTC")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise _invalid(f"unknown time zone {name!r}: use an IANA name such as Europe/Paris or UTC") from None


def parse_instant(value: str | dt.datetime, timezone: str | None = None) -> dt.datetime:
    """An ISO 8601 date-time as a UTC instant; without an offset it is read in ``timezone``."""
    if isinstance(value, dt.datetime):
        moment = value
    else:
        text = str(value).strip()
        try:
            moment = dt.datetime.fromisoformat(text)
        except ValueError:
            raise _invalid(f"fire_at {text[:64]!r} is not an ISO 8601 date-time "
                           "(e.g. 2026-05-01T09:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone(timezone))
    return moment.astimezone(UTC)


def _utc(moment: dt.datetime) -> dt.datetime:
    if moment.tzinfo is None:
        raise ValueError("expected an aware datetime")
    return moment.astimezone(UTC)


# -- cron -------------------------------------------------------------------------------

def canonical_cron(text: str) -> str:
    """Validate a 5-field cron expression (or macro); its canonical spelling."""
    if not isinstance(text, str):
        raise _invalid("cron must be a string of five fields")
    expr = " ".join(text.split())
    expr = _MACROS.get(expr.lower(), expr)
    if not expr:
        raise _invalid("cron is empty: give five fields (minute hour day-of-month month day-of-week)")
    fields = expr.split(" ")
    if len(fields) != 5:
        extra = "; seconds are not supported" if len(fields) == 6 else ""
        raise _invalid(f"cron {text[:100]!r} has {len(fields)} fields: give five "
                       f"(minute hour day-of-month month day-of-week){extra}")
    try:
        next(cronsim.CronSim(expr, dt.datetime(2000, 1, 1, tzinfo=UTC)))
    except (cronsim.CronSimError, StopIteration, ValueError) as exc:
        reason = str(exc) or "never fires"
        raise _invalid(f"invalid cron {text[:100]!r}: {reason[0].lower() + reason[1:]}") from None
    return expr.upper() if re.search(r"[a-z]", expr) else expr


# -- every ------------------------------------------------------------------------------

def _duration(text: str) -> int:
    """``5m``, ``2 hours``, ``90s`` -> seconds."""
    match = _INTERVAL.fullmatch(text.strip().lower())
    if not match or match[2] not in _UNITS:
        raise _invalid(f"every {text[:40]!r}: write a number and a unit, e.g. 30s, 5m, 2h, 1d, 1w")
    seconds = int(match[1]) * _UNITS[match[2]]
    if seconds <= 0:
        raise _invalid(f"every {text[:40]!r}: the interval must be positive")
    return seconds


def every_to_cron(text: str) -> str:
    """The cron expression of an interval, or InvalidInput saying why cron cannot say it."""
    if not isinstance(text, str):
        raise _invalid("every must be a string such as 5m")
    seconds = _duration(text)
    if seconds % 60:
        raise _invalid(f"every {text!r}: schedules have minute resolution; use a whole number of minutes")
    minutes = seconds // 60
    if minutes < 60:
        if 60 % minutes:
            raise _invalid(f"every {text!r}: {minutes} minutes does not divide an hour, so cron cannot repeat it "
                           "evenly; use one of 1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 minutes or a cron expression")
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    if minutes % 60:
        raise _invalid(f"every {text!r}: an interval over an hour must be a whole number of hours")
    hours = minutes // 60
    if hours < 24:
        if 24 % hours:
            raise _invalid(f"every {text!r}: {hours} hours does not divide a day, so cron cannot repeat it "
                           "evenly; use one of 1, 2, 3, 4, 6, 8, 12 hours or a cron expression")
        return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    if hours == 24:
        return "0 0 * * *"
    if hours == 24 * 7:
        return "0 0 * * 0"
    raise _invalid(f"every {text!r}: cron can repeat every day or every week (at midnight), not every "
                   f"{hours // 24 if hours % 24 == 0 else hours} {'days' if hours % 24 == 0 else 'hours'}; "
                   "use a cron expression such as '0 0 */2 * *' (days 1, 3, 5... of each month)")


# -- when (a small English form) --------------------------------------------------------

def _clock(text: str) -> tuple[int, int]:
    """``09:00``, ``9``, ``8am``, ``5:30 pm``, ``noon``, ``midnight`` -> (hour, minute)."""
    t = text.strip().lower()
    if t == "noon":
        return 12, 0
    if t == "midnight":
        return 0, 0
    match = re.fullmatch(r"(\d{1,2})(?::(\d{2}))?\s*(am|pm)?", t)
    if not match:
        raise _invalid(f"cannot read the time {text[:20]!r}: write 09:00, 17:30, 8am, 5:30pm, noon or midnight")
    hour, minute, half = int(match[1]), int(match[2] or 0), match[3]
    if half:
        if not 1 <= hour <= 12:
            raise _invalid(f"cannot read the time {text!r}: with am/pm the hour is 1 to 12")
        hour = hour % 12 + (12 if half == "pm" else 0)
    if hour > 23 or minute > 59:
        raise _invalid(f"cannot read the time {text!r}: hours are 0-23 and minutes 0-59")
    return hour, minute


def _day_field(words: str) -> str | None:
    """``day`` -> *, ``weekday`` -> 1-5, ``weekend`` -> 0,6, ``monday and friday`` -> 1,5;
    None if the words name no days."""
    w = words.strip().lower()
    if w in ("day", "days"):
        return "*"
    if w in ("weekday", "weekdays"):
        return "1-5"
    if w in ("weekend", "weekends"):
        return "0,6"
    days = []
    for part in re.split(r"\s*(?:,|\band\b)\s*", w):
        name = part[:-1] if part.endswith("s") and part[:-1] in _DAYS else part
        match = [n for n in _DAYS if n == name or (len(name) >= 3 and n.startswith(name))]
        if len(match) != 1:
            return None
        days.append(_DAYS[match[0]])
    return ",".join(str(d) for d in sorted(set(days)))


def when_to_cron(text: str) -> str:
    """The cron expression of a ``when`` phrase (see ``_WHEN_FORMS``)."""
    if not isinstance(text, str):
        raise _invalid("when must be a string such as 'every day at 09:00'")
    t = " ".join(text.lower().replace(",", " , ").split()).replace(" , ", ", ")
    if t in _FIXED:
        return _FIXED[t]
    match = re.fullmatch(r"(?:every (.+?)|daily|weekly|monthly)(?: at (.+))?", t)
    if match:
        head = t.split(" at ")[0]
        at = match[2]
        if head in ("daily", "weekly", "monthly"):
            day_fields = {"daily": "* * *", "weekly": "* * 0", "monthly": "1 * *"}[head]
            hour, minute = _clock(at) if at else (0, 0)
            return f"{minute} {hour} {day_fields}"
        what = match[1]
        if at is None and _INTERVAL.fullmatch(what):
            return every_to_cron(what)
        days = _day_field(what)
        if days is not None:
            hour, minute = _clock(at) if at else (0, 0)
            return f"{minute} {hour} * * {days}"
        if what == "month":
            hour, minute = _clock(at) if at else (0, 0)
            return f"{minute} {hour} 1 * *"
    raise _invalid(f"cannot read when {text[:100]!r}; forms understood: " + "; ".join(_WHEN_FORMS))


_FIXED = {
    "hourly": "0 * * * *", "every minute": "* * * * *", "every hour": "0 * * * *",
    "every week": "0 0 * * 0",
}
_WHEN_FORMS = (
    "hourly | daily | weekly | monthly",
    "every minute | every hour | every day | every week | every month",
    "every N minutes | every N hours (as for 'every')",
    "every day at TIME | daily at TIME | weekly at TIME (Sundays) | monthly at TIME (the 1st)",
    "every monday [and friday ...] [at TIME] | every weekday [at TIME] | every weekend [at TIME]",
    "TIME: 09:00, 17:30, 8am, 5:30pm, noon, midnight",
)


# -- parse ------------------------------------------------------------------------------

def parse(*, cron: str | None = None, every: str | None = None, when: str | None = None,
          fire_at: str | dt.datetime | None = None, timezone: str | None = None) -> types.ScheduleExpression:
    """Canonicalise one of the four shapes (exactly one must be given)."""
    given = {k: v for k, v in (("cron", cron), ("every", every), ("when", when), ("fire_at", fire_at))
             if v is not None}
    if len(given) != 1:
        raise _invalid("give exactly one of cron, every, when or fire_at"
                       + (f" (got {', '.join(given)})" if given else ""))
    shape, value = next(iter(given.items()))
    tz = "UTC" if timezone is None else timezone
    zone(tz)
    source = {shape: value.isoformat() if isinstance(value, dt.datetime) else str(value)}
    if timezone is not None:
        source["timezone"] = tz
    if shape == "fire_at":
        return types.ScheduleExpression(kind="once", timezone=tz, fire_at=parse_instant(value, tz), source=source)
    if not isinstance(value, str):
        raise _invalid(f"{shape} must be a string")
    expression = {"cron": canonical_cron, "every": every_to_cron, "when": when_to_cron}[shape](value)
    if shape != "cron":
        expression = canonical_cron(expression)
    return types.ScheduleExpression(kind="cron", cron=expression, timezone=tz, source=source)


# -- fire times -------------------------------------------------------------------------

def _occurrences(expr: types.ScheduleExpression, after: dt.datetime) -> Iterator[dt.datetime]:
    """Fire times strictly after ``after``, as UTC instants, in order."""
    if expr.kind == "once":
        if expr.fire_at is not None and expr.fire_at > after:
            yield expr.fire_at
        return
    try:
        it = cronsim.CronSim(expr.cron or "", _utc(after).astimezone(zone(expr.timezone)))
    except cronsim.CronSimError as exc:  # a cron stored from SQL alone is checked only here
        raise _invalid(f"invalid cron {expr.cron!r}: {exc}") from None
    for moment in it:
        yield moment.astimezone(UTC)


def next_after(expr: types.ScheduleExpression, after: dt.datetime) -> dt.datetime | None:
    """The first fire time strictly after ``after`` (None: a one-shot already past)."""
    return next(_occurrences(expr, after), None)


def next_fires(expr: types.ScheduleExpression, after: dt.datetime, count: int) -> list[dt.datetime]:
    """Up to ``count`` fire times strictly after ``after``."""
    if not 0 <= count <= MAX_PREVIEW:
        raise _invalid(f"count must be from 0 to {MAX_PREVIEW}, got {count}")
    found: list[dt.datetime] = []
    for moment in _occurrences(expr, after):
        if len(found) >= count:
            break
        found.append(moment)
    return found


def due(expr: types.ScheduleExpression, first: dt.datetime, now: dt.datetime, keep: int) -> list[dt.datetime]:
    """The fire times from ``first`` (a fire time itself) to ``now``, both included: the
    latest ``keep`` of them, oldest first. A schedule far behind is not walked minute by
    minute from ``first``: past ``_MAX_SCAN`` occurrences the walk restarts closer to now."""
    first, now = _utc(first), _utc(now)
    if first > now or keep < 1:
        return []
    if expr.kind == "once":
        return [first]
    latest: deque[dt.datetime] = deque([first], maxlen=keep)
    walked = 0
    for moment in _occurrences(expr, first):
        if moment > now:
            return list(latest)
        latest.append(moment)
        walked += 1
        if walked >= _MAX_SCAN:
            break
    # far behind: look back from now over windows that grow until they hold `keep` fires
    span = (latest[-1] - first) / walked * (keep + 1)
    while True:
        start = max(first, now - span)
        window = [first] if start == first else []
        for moment in _occurrences(expr, start):
            if moment > now:
                break
            window.append(moment)
        if len(window) >= keep or start == first:
            return window[-keep:]
        span *= 4


# -- description ------------------------------------------------------------------------

def describe(expr: types.ScheduleExpression) -> str:
    """The expression in words, e.g. 'At 09:00, only on Monday (Europe/Paris)'."""
    if expr.kind == "once":
        assert expr.fire_at is not None
        return f"Once, at {expr.fire_at.strftime('%Y-%m-%d %H:%M:%S')} UTC"
    assert expr.cron is not None
    try:
        words = cron_descriptor.ExpressionDescriptor(
            expr.cron, use_24hour_time_format=True, verbose=False).get_description()
    except Exception:  # noqa: BLE001 - the describer knows less syntax than cronsim; the cron is valid
        words = f"cron {expr.cron}"
    return f"{words} ({expr.timezone})"
