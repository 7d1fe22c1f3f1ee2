"""What each DDM feature is called for a user, and the sentence that says a VM lacks it.

Layer: standard library only (part of the sans-IO session). The snapshot keeps the machine keys
(the request types ddmd found missing, e.g. "HPSG") for scripts; everything a person reads --
CLI lines, API error messages, the web page's notices -- is built here, in words a DDMS or
Android Studio user knows.
"""

from __future__ import annotations

from typing import Final

#: What a feature gives the user, as a noun: "could not give <noun>".
WORDS: Final = {
    "HELO": "its identity over DDM",
    "FEAT": "its feature list",
    "THEN": "thread start and end notices",
    "THST": "thread states",
    "STKL": "stack traces",
    "HPIF": "heap information",
    "HPSG": "heap segments",
    "NHSG": "native heap segments",
    "HPGC": "a garbage collection",
    "DBGD": "a debugger release without a reconnect",
    "MPSS": "method tracing",
    "MPRS": "method tracing",
    "MPSE": "method traces",
    "MPRE": "method traces",
    "SPSS": "sampling profiling",
    "SPSE": "sampling profiling",
    "MPRQ": "whether it is tracing",
    "REAE": "the allocation tracker",
    "REAQ": "the allocation tracker",
    "REAL": "the allocation tracker",
    "HPDS": "heap dumps (HPROF)",
    "HPDU": "heap dumps (HPROF)",
    "EXIT": "a way to stop the app",
}

#: The sentence's verb phrase: "<VM> <lacks>".
_LACKS: Final = {
    "HPGC": "does not run garbage collections on request",
    "DBGD": "does not release a debugger without a reconnect",
    "MPSS": "does not offer method tracing",
    "SPSS": "does not offer sampling profiling",
    "REAE": "does not offer the allocation tracker",
    "REAQ": "does not offer the allocation tracker",
    "REAL": "does not offer the allocation tracker",
    "HPDS": "does not offer heap dumps (HPROF)",
    "HPDU": "does not offer heap dumps (HPROF)",
    "EXIT": "cannot be stopped through DDM",
}

#: Why a VM is silent where an older one answers (protocol.md 3.8): said after "no answer".
SILENCE_HINTS: Final = {
    "THEN": "newer Android versions removed the thread handlers",
    "THST": "newer Android versions removed the thread handlers",
    "STKL": "newer Android versions removed the thread handlers",
    "HPIF": "Android 12 removed the heap handlers",
    "HPSG": "Android 12 removed them",
    "NHSG": "Android 12 removed them",
    "REAQ": "Android 12 removed the allocation tracker",
    "REAL": "Android 12 removed the allocation tracker",
    "HPDS": "newer Android versions removed the heap dump handler",
    "HPDU": "newer Android versions removed the heap dump handler",
}


def words(feature: str) -> str:
    return WORDS.get(feature, f"the {feature} feature")


def missing_sentence(vm_name: str, feature: str, why: str, *, ddm: bool | None) -> str:
    """``vm_name`` lacks ``feature``, and why: one sentence in a user's words."""
    if feature == "HELO":
        return f"{vm_name} does not speak DDM (a plain JVM has none)"
    if ddm is False:
        lacks = _LACKS.get(feature, f"has no {words(feature)}")
        return f"{vm_name} does not speak DDM (a plain JVM has none), so it {lacks}"
    lacks = _LACKS.get(feature, f"does not report {words(feature)}")
    return f"{vm_name} {lacks} ({why})" if why else f"{vm_name} {lacks}"


def silence_reason(feature: str, seconds: float) -> str:
    hint = SILENCE_HINTS.get(feature)
    base = f"no answer within {seconds:g} s"
    return f"{base}; {hint}" if hint else base


def no_logcat_sentence(name: str) -> str:
    """Why a VM has no logcat: it is not on an Android device."""
    return (
        f"{name} runs on a local port, not on an Android device: it has no device log "
        "(only Android devices and emulators keep a log ddmd can read)"
    )
