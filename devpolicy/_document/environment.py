"""`DEVPOLICY_*` environment variables, parsed strictly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from .._base.errors import EnvOverrideError, did_you_mean
from .._base.files import check_regular
from .fields import LOG_FORMATS, LOG_LEVELS, TRANSFER_DIRECTIONS, TRANSFER_FIELDS, TRANSFER_MODES
from .remote import VARIABLES as REMOTE_VARIABLES
from .remote import from_environment as remote_from_environment
from .schema import RuleSpec
from .targets import (
    REJECT,
    SHARDING_FORMS,
    TARGET_FORMS,
    check_default,
    parse_sharding,
    parse_target,
)

PREFIX = "DEVPOLICY_"
FILE = "DEVPOLICY_FILE"
RULES = "DEVPOLICY_RULES"
DEFAULT = "DEVPOLICY_DEFAULT"
STRICT = "DEVPOLICY_STRICT"
LOG_LEVEL = "DEVPOLICY_LOG_LEVEL"
LOG_FORMAT = "DEVPOLICY_LOG_FORMAT"
DISABLE = "DEVPOLICY_DISABLE"
#: `transfers:` of the policy, overridden (`log`, or `device_to_device=disallow,...`).
TRANSFERS = "DEVPOLICY_TRANSFERS"
#: A policy must be found (discovery that finds none raises instead of warning).
REQUIRE = "DEVPOLICY_REQUIRE"
#: Set by `devpolicy run` for its child (the runtime variables it set from the policy).
RUNTIME_SET = "DEVPOLICY_RUNTIME_SET"
VARIABLES = (
    FILE, RULES, DEFAULT, STRICT, LOG_LEVEL, LOG_FORMAT, DISABLE, REQUIRE, RUNTIME_SET,
    TRANSFERS,
    *REMOTE_VARIABLES,
)  # fmt: skip

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
BOOL_FORMS = "1, true, yes, on / 0, false, no, off (any case)"
#: How a `DEVPOLICY_RULES` item names the tensors of a file (a `file:` rule), not a name.
FILE_FORM = "file:"
RULES_FORMS = (
    f"pattern=target[,pattern=target...] (pattern: a glob on names, or {FILE_FORM}GLOB for "
    f"every tensor of the files GLOB matches, e.g. {FILE_FORM}train*.safetensors=cpu:1), "
    f"where target is {TARGET_FORMS}; or a sharding of a mesh the policy defines, "
    f"{SHARDING_FORMS}"
)


@dataclass(frozen=True, slots=True)
class EnvSettings:
    """What the environment asks for; None where a variable is unset or empty."""

    file: Path | None = None
    rules: tuple[RuleSpec, ...] = ()
    default: str | None = None
    strict: bool | None = None
    disable: bool | None = None
    require: bool | None = None
    log_level: str | None = None
    log_format: str | None = None
    #: `DEVPOLICY_RULES` as given, and each of its rules' text, for errors found later
    #: (a mesh the policy lacks is known only once the policy is read).
    rules_text: str = ""
    rule_texts: tuple[str, ...] = ()
    #: `DEVPOLICY_REMOTE_*` by the `remote:` field each sets (`{"chunk": 16777216}`).
    remote: Mapping[str, object] = field(default_factory=dict)
    #: `DEVPOLICY_TRANSFERS` by the `transfers:` field each item sets (`{"host_to_device": "log"}`).
    transfers: Mapping[str, str] = field(default_factory=dict)

    def rule_error(self, index: int, problem: str, accepted: str) -> EnvOverrideError:
        """An error about rule `index` of `DEVPOLICY_RULES` that shows the value and the rule.

        Example:
            >>> env = read_env({"DEVPOLICY_RULES": "a=cpu, b=p[x]"})
            >>> print(env.rule_error(1, "unknown mesh 'p'", "a mesh"))
            DEVPOLICY_RULES='a=cpu, b=p[x]': item 1 ('b=p[x]'): unknown mesh 'p'; accepted: a mesh
        """
        return EnvOverrideError(
            RULES,
            self.rules_text,
            f"item {index} ({self.rule_texts[index]!r}): {problem}",
            accepted,
        )


def read_env(environ: Mapping[str, str]) -> EnvSettings:
    """Parse every `DEVPOLICY_*` variable.

    An empty value counts as unset. Unknown `DEVPOLICY_*` names are errors, since a typo
    would otherwise be silently ignored.

    Raises:
        EnvOverrideError: naming the variable, its value and the accepted forms.
    """
    for name, value in environ.items():
        if not isinstance(name, str) or not name.startswith(PREFIX):
            continue
        if not isinstance(value, str):
            raise EnvOverrideError(
                name, repr(value), "environment values must be strings", "a string"
            )
        if name not in VARIABLES:
            hint = _hint(name)
            raise EnvOverrideError(
                name, value, f"unknown devpolicy variable{hint}", ", ".join(VARIABLES)
            )
    values = {name: environ[name] for name in VARIABLES if environ.get(name, "") != ""}
    return EnvSettings(
        file=_file(values.get(FILE)),
        rules=_rules(values.get(RULES)),
        default=_default(values.get(DEFAULT)),
        strict=_bool(STRICT, values.get(STRICT)),
        disable=_bool(DISABLE, values.get(DISABLE)),
        require=_bool(REQUIRE, values.get(REQUIRE)),
        log_level=_choice(LOG_LEVEL, values.get(LOG_LEVEL), LOG_LEVELS),
        log_format=_choice(LOG_FORMAT, values.get(LOG_FORMAT), LOG_FORMATS),
        rules_text=values.get(RULES, ""),
        rule_texts=tuple(i.strip() for i in _items(values[RULES])) if RULES in values else (),
        remote=remote_from_environment(values),
        transfers=_transfers(values.get(TRANSFERS)),
    )


TRANSFERS_FORMS = (
    f"MODE[,field=mode...]: a mode for every direction ({', '.join(TRANSFER_MODES)}), then "
    f"any overrides, or field=mode[,field=mode...] alone, with field one of "
    f"{', '.join(TRANSFER_FIELDS)}"
)


def _transfers(value: str | None) -> dict[str, str]:
    """`DEVPOLICY_TRANSFERS`: `log` (every direction), `device_to_device=disallow,...`, or
    both: a bare mode first, then overrides (`log,host_local=log`: everything at `log`,
    `host_local` too).

    Example:
        >>> _transfers("device_to_device=disallow, host_to_device=log")
        {'device_to_device': 'disallow', 'host_to_device': 'log'}
        >>> _transfers("log, device_to_host=allow")
        {'host_to_device': 'log', 'device_to_device': 'log', 'device_to_host': 'allow'}
    """
    if value is None:
        return {}
    out: dict[str, str] = {}
    overridden: set[str] = set()

    def refuse(problem: str) -> EnvOverrideError:
        return EnvOverrideError(TRANSFERS, value, problem, TRANSFERS_FORMS)

    for position, item in enumerate(part.strip() for part in value.split(",")):
        name, sep, mode = (part.strip() for part in item.partition("="))
        if not item:
            raise refuse(f"item {position} is empty")
        if not sep:
            if name not in TRANSFER_MODES:
                hint = did_you_mean(name, TRANSFER_MODES)
                where = f"item {item!r}: " if "," in value else ""  # a lone mode is the value
                raise refuse(f"{where}unknown transfer mode {name!r}{hint}")
            if position:
                raise refuse(f"item {item!r}: a bare mode comes first, before the overrides")
            out = dict.fromkeys(TRANSFER_DIRECTIONS, name)
            continue
        if name not in TRANSFER_FIELDS:
            hint = did_you_mean(name, TRANSFER_FIELDS) if name else ""
            raise refuse(f"item {item!r}: unknown field{hint}")
        if mode not in TRANSFER_MODES:
            hint = did_you_mean(mode, TRANSFER_MODES)
            raise refuse(f"item {item!r}: unknown mode {mode!r}{hint}")
        if name in overridden:
            raise refuse(f"{name} is given twice")
        overridden.add(name)
        out[name] = mode
    return out


def _hint(name: str) -> str:
    """Did-you-mean on what follows the prefix: every name shares `DEVPOLICY_`, so comparing
    whole names makes `DEVPOLICY_X` look like `DEVPOLICY_FILE`."""
    suffixes = {v.removeprefix(PREFIX): v for v in VARIABLES}
    close = did_you_mean(name.removeprefix(PREFIX), suffixes)
    if not close:
        return ""
    suggested = close.split("'")[1]
    return f" (did you mean {suffixes[suggested]!r}?)"


def _file(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    problem = check_regular(path, "a policy file")
    if problem is not None:
        raise EnvOverrideError(FILE, value, problem, "the path of a YAML policy file")
    return path


def _rules(value: str | None) -> tuple[RuleSpec, ...]:
    if value is None:
        return ()
    rules = []
    for i, item in enumerate(_items(value)):
        pattern, eq, target = item.strip().rpartition("=")
        pattern, target = pattern.strip(), target.strip()
        if not eq or not pattern or not target:
            raise EnvOverrideError(
                RULES, value, f"item {i} ({item.strip()!r}) is not pattern=target", RULES_FORMS
            )
        if "=" in pattern or ";" in pattern:
            raise EnvOverrideError(
                RULES,
                value,
                f"item {i} ({item.strip()!r}) holds more than one rule; separate rules with ','",
                RULES_FORMS,
            )
        head, colon, _ = pattern.partition(":")
        if colon and head != FILE_FORM[:-1] and "/" not in head and did_you_mean(head, ["file"]):
            raise EnvOverrideError(
                RULES,
                value,
                f"item {i} ({item.strip()!r}): {head + ':'!r} is no form (did you mean "
                f"{FILE_FORM!r}?)",
                RULES_FORMS,
            )
        # `file:GLOB` names the tensors of a file, as a policy's `file:` rule does.
        names = (
            {"file": pattern[len(FILE_FORM) :].strip()}
            if pattern.startswith(FILE_FORM)
            else {"match": pattern}
        )
        try:
            if "[" in target:
                sharding = parse_sharding(target)
                spec = [list(e) if isinstance(e, tuple) else e for e in sharding.spec]
                rules.append(
                    RuleSpec.model_validate(
                        {**names, "sharding": {"mesh": sharding.mesh, "spec": spec}}
                    )
                )
                continue
            parse_target(target)
            rules.append(RuleSpec.model_validate({**names, "device": target}))
        except (ValueError, ValidationError) as e:
            reason = str(e) if not isinstance(e, ValidationError) else e.errors()[0]["msg"]
            raise EnvOverrideError(
                RULES, value, f"item {i}: {_problem(reason)}", RULES_FORMS
            ) from None
    return tuple(rules)


#: What `pattern=target` cannot say and an override of a rule keeps from it: how a tensor
#: is loaded and committed, not where it goes.
CARRIED = ("mmap", "commit", "inputs", "fits")


def carried(env_rules: tuple[RuleSpec, ...], rules: list[RuleSpec]) -> tuple[RuleSpec, ...]:
    """`DEVPOLICY_RULES` rules with the options (`CARRIED`) of the first rule in `rules`
    (the policy's) that they override: the rule with the same glob (`dataset/*`), or for
    a `file:GLOB` item the policy's `file:` rule with the same glob and no name pattern.
    Overriding where `dataset/*` or `file:train*.safetensors` goes keeps its `mmap: true`.
    A sharding keeps only `commit` and `inputs` (it is never mapped).

    Example:
        >>> env = (RuleSpec(match="data/*", device="cpu:1"), RuleSpec(file="t*", device="cpu:1"))
        >>> policy = [RuleSpec(match="data/*", device="cpu", mmap=True),
        ...           RuleSpec(file="t*", device="cpu", mmap=True)]
        >>> [rule.mmap for rule in carried(env, policy)]
        [True, True]
    """
    out = []
    for rule in env_rules:
        same = next((r for r in rules if _overrides(rule, r)), None)
        if same is None:
            out.append(rule)
            continue
        keep = CARRIED if rule.device is not None else ("commit", "inputs")
        out.append(rule.model_copy(update={k: getattr(same, k) for k in keep}))
    return tuple(out)


def _overrides(env_rule: RuleSpec, rule: RuleSpec) -> bool:
    """Whether `env_rule` (a `DEVPOLICY_RULES` item) overrides the policy's `rule`: the same
    name glob, or the same file glob where both name no pattern."""
    if env_rule.match is not None:
        return rule.match == env_rule.match
    unnamed = rule.match is None and rule.regex is None and rule.search is None
    return env_rule.file is not None and unnamed and rule.file == env_rule.file


def _items(value: str) -> list[str]:
    """Split rules at commas outside brackets (a sharding's spec has commas of its own)."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(value):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            items.append(value[start:i])
            start = i + 1
    items.append(value[start:])
    return items


def _problem(message: str) -> str:
    """A parser's message without its own "accepted" list (the error adds one)."""
    return message.split("; accepted:", 1)[0]


def _default(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_default(value)
    except ValueError as e:
        problem = _problem(str(e)).split(f"; or {REJECT}", 1)[0]
        hint = did_you_mean(value, [REJECT])
        raise EnvOverrideError(
            DEFAULT, value, f"{problem}{hint}", f"{TARGET_FORMS}; or {REJECT}"
        ) from None


def _bool(variable: str, value: str | None) -> bool | None:
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise EnvOverrideError(variable, value, "not a boolean", BOOL_FORMS)


def _choice(variable: str, value: str | None, choices: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered in choices:
        return lowered
    hint = did_you_mean(lowered, choices)
    raise EnvOverrideError(variable, value, f"unknown value{hint}", ", ".join(choices))
