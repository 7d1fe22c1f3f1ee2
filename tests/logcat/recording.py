"""THE recorded logcat stream the logcat tests replay: one device's ``logcat -B`` output, with
fixed timestamps, built with the test-side writer (`tests.logcat.writer`, v4 headers).

    from tests.logcat import recording as rec
    device = FakeDevice(logcat=rec.STREAM)         # the fake device's ring buffer
    rec.ENTRIES[i]                                 # what the decoder must give for record i
    rec.lines_of(rec.MAIL)                         # indices of the entries mail's processes wrote
    rec.lines_about(rec.MAIL)                      # ... plus system lines about mail

The story (t: seconds after 2023-11-14 22:13:20 UTC, nanoseconds vary too; "sys" is
system_server, pid 600, uid 1000; AM is ActivityManager, ATM ActivityTaskManager; buffers m main,
s system, c crash; "by" = `Recorded.app`, the app whose process wrote it; "about" = `Recorded.about`
with the crash mark in brackets)::

    #   t       pid   tid  b lvl tag              by / about     message
    0   0.010   512   512  m D   wificond         - / -          wlan0: scan results ready (...)
    1   0.100   600   632  s I   ActivityManager  - / mail       Start proc 4242:com.example.mail/
                                                                 u0a123 for top-activity {...}
    2   0.250  4242  4242  m D   MailApp          mail           onCreate: 2 accounts
    3   0.400   600   632  s I   ActivityManager  - / maps       Start proc 4300:com.example.maps/
                                                                 u0a124 for activity {...}
    4   0.550  4300  4300  m D   MapsApp          maps           onCreate
    5   0.700  4242  4257  m V   Mail Sync        mail           poll tick (a tag with a space)
    6   0.850  4300  4312  m I   MapsRenderer     maps           frame 1 drawn in 16 ms
    7   1.000  4242  4257  m I   MailSync         mail           4 lines in one entry
    8   1.150  4300  4315  m W   LocationService  maps           GPS fix is stale (...)
    9   1.300  4242  4259  m E   MailStore        mail           invalid UTF-8 (0xe9, 0xe8)
    10  2.000   600   632  s I   ActivityManager  - / mail [died]  Process com.example.mail
                                                                 (pid 4242) has died: cch+5 CEM
    11  2.500   600   632  s I   ActivityManager  - / mail       Start proc 4301:com.example.mail/..
    12  2.650  4301  4301  m D   MailApp          mail           onCreate (the new pid)
    13  2.800  4301  4318  m I   MailSync         mail           resumed after restart: 3 folders
    14  4.000   600   640  s E   ActivityManager  - / maps [anr]  ANR in com.example.maps (...)
                                                                 PID: 4300, Reason: ... (7 lines)
    15  6.200  4300  4300  m W   MapsApp          maps           main thread unblocked after 7.2 s
    16  7.000  4300  4300  c E   AndroidRuntime   maps [java]    FATAL EXCEPTION: main, Process:
                                                                 com.example.maps, PID: 4300, the
                                                                 trace: ONE 16-line entry
    17  7.010   600   641  s W   ATM              - / maps         Force finishing activity ...
    18  7.050  4300  4300  m I   Process          maps           Sending signal. PID: 4300 SIG: 9
    19  7.300   600   632  s I   ActivityManager  - / maps [died]  Process com.example.maps
                                                                 (pid 4300) has died: fg  TOP
    20  9.000  4301  4318  m D   MailSync         mail           fetching 2 messages
    21  9.500  4301  4301  c F   libc             mail [native]  Fatal signal 11 (SIGSEGV), ...
    22  9.600  4320  4320  c F   DEBUG            - / mail [native]  *** *** *** ... (the tombstone:
    ..  ...                                                      one entry per line, 14 lines,
    35  9.665                                                    crash_dump64's pid)
    36  10.500  600   632  s I   ActivityManager  - / mail [died]  Process com.example.mail
                                                                 (pid 4301) has died: fg  TOP
    37  12.000  600   632  s I   ActivityManager  - / other      Start proc 4242:com.other.app/
                                                                 u0a130 for broadcast {...}
    38  12.150 4242  4242  m I   OtherApp         other          pid 4242 is com.other.app's now
    39  12.300 4242  4251  m W   OtherApp         other          job scheduler quota low (3 left)
    40  12.450  512   512  m D   wificond         - / -          wlan0: scan results ready (...)

Levels V, D, I, W, E and F all occur; buffers main (0), system (3) and crash (4). Pids: mail 4242
then 4301 (uid 10123, u0a123), maps 4300 (uid 10124), com.other.app 4242 again (uid 10130),
crash_dump64 4320 (uid 10123: it runs as the crashing app), wificond 512 (uid 1010).

"app" is the app whose process wrote the entry (by pid, at that time): `lines_of`. "about" is the
app a line by someone else concerns (ActivityManager, ActivityTaskManager, the tombstone):
`lines_about` adds those. "crash" marks crash lines: "java", "native", "anr", "died".

Wording checked against AOSP sources (the search tool, corpus "code"): ``Start proc
PID:PROCESS/UID for TYPE {COMPONENT}`` (ProcessList.java ``buf.append("Start proc ")`` and
HostingRecord's ``hostingName.toShortString()``, types "top-activity", "activity",
"broadcast"); ``Process APP (pid P) has died: ADJ STATE`` (ActivityManagerService
``appDiedLocked``, ``makeOomAdjString(setAdj, true)``: "cch+5", "fg "); the Java crash is
``RuntimeInit.logUncaught``'s message ``FATAL EXCEPTION: THREAD\\nProcess: APP, PID: P`` plus the
stack trace, written by ``Log.printlns(LOG_ID_CRASH, ERROR, "AndroidRuntime", ...)`` through a
LineBreakBufferedWriter, i.e. ONE entry (split only past ~4000 bytes) ending with a newline;
``Fatal signal ...`` is bionic's debuggerd handler (FATAL goes to the crash buffer in
``async_safe_write_log``); the tombstone lines are libdebuggerd's ``_LOG`` calls (Android 11
``tombstone.cpp``: one ``__android_log_buf_write(LOG_ID_CRASH, ANDROID_LOG_FATAL, "DEBUG", ...)``
per line, each ending with "\\n"; "fault addr 0x0" is its ``0x%zx``; the thread name is the
kernel's 15-byte comm, the tail of the process name); the ANR is ``appNotResponding``'s
``ANR in APP (ACTIVITY)\\nPID: P\\nReason: ...`` (one ``Slog.e`` entry).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddmd.protocol.logcat import LogEntry
from tests.logcat.writer import Record, write_record

__all__ = [
    "APPS",
    "BASE_SEC",
    "CRASH_DUMP_PID",
    "ENTRIES",
    "MAIL",
    "MAIL_PID",
    "MAIL_PID_2",
    "MAIL_UID",
    "MAPS",
    "MAPS_PID",
    "MAPS_UID",
    "OTHER",
    "OTHER_PID",
    "OTHER_UID",
    "RECORDED",
    "RECORDS",
    "RECORD_BYTES",
    "STREAM",
    "SYSTEM_SERVER_PID",
    "Recorded",
    "crash_lines",
    "entry_of",
    "lines_about",
    "lines_of",
]

BASE_SEC = 1_700_000_000  # 2023-11-14 22:13:20 UTC

MAIL = "com.example.mail"
MAPS = "com.example.maps"
OTHER = "com.other.app"
MAIL_PID, MAIL_PID_2, MAPS_PID, OTHER_PID = 4242, 4301, 4300, 4242
MAIL_UID, MAPS_UID, OTHER_UID = 10123, 10124, 10130
SYSTEM_SERVER_PID, SYSTEM_UID = 600, 1000
CRASH_DUMP_PID = 4320
WIFICOND_PID, WIFI_UID = 512, 1010
#: Each app's pids, in order.
APPS: dict[str, tuple[int, ...]] = {
    MAIL: (MAIL_PID, MAIL_PID_2),
    MAPS: (MAPS_PID,),
    OTHER: (OTHER_PID,),
}

MAIN, SYSTEM, CRASH = 0, 3, 4
_V, _D, _I, _W, _E, _F = 2, 3, 4, 5, 6, 7


@dataclass(frozen=True, slots=True)
class Recorded:
    """One record of the recording and what it is by design."""

    record: Record
    app: str | None = None  # whose process wrote it
    about: str | None = None  # the app a line by another process is about
    crash: str | None = None  # "java", "native", "anr", "died"


def _at(ms: int, index: int) -> tuple[int, int]:
    """(sec, nsec) of ``ms`` after BASE_SEC, plus ``index`` * 1001 ns (every field to the ns)."""
    ns = ms * 1_000_000 + index * 1001
    return BASE_SEC + ns // 1_000_000_000, ns % 1_000_000_000


def _start(pid: int, app: str, uid: int, how: str) -> bytes:
    return f"Start proc {pid}:{app}/u0a{uid - 10000} for {how}".encode()


_JAVA_CRASH = (
    "FATAL EXCEPTION: main\n"
    f"Process: {MAPS}, PID: {MAPS_PID}\n"
    "java.lang.IllegalStateException: tile cache is closed\n"
    "\tat com.example.maps.TileCache.get(TileCache.java:88)\n"
    "\tat com.example.maps.MainActivity.onCreate(MainActivity.java:42)\n"
    "\tat android.app.Activity.performCreate(Activity.java:8000)\n"
    "\tat android.app.Activity.performCreate(Activity.java:7984)\n"
    "\tat android.app.Instrumentation.callActivityOnCreate(Instrumentation.java:1309)\n"
    "\tat android.app.ActivityThread.performLaunchActivity(ActivityThread.java:3422)\n"
    "\tat android.app.ActivityThread.handleLaunchActivity(ActivityThread.java:3601)\n"
    "\tat android.os.Handler.dispatchMessage(Handler.java:106)\n"
    "\tat android.os.Looper.loop(Looper.java:223)\n"
    "\tat android.app.ActivityThread.main(ActivityThread.java:7656)\n"
    "\tat java.lang.reflect.Method.invoke(Native Method)\n"
    "\tat com.android.internal.os.RuntimeInit$MethodAndArgsCaller.run(RuntimeInit.java:592)\n"
    "\tat com.android.internal.os.ZygoteInit.main(ZygoteInit.java:947)\n"
)

_ANR = (
    f"ANR in {MAPS} (com.example.maps/.MainActivity)\n"
    f"PID: {MAPS_PID}\n"
    "Reason: Input dispatching timed out (1d3c1a8 com.example.maps/com.example.maps.MainActivity"
    " (server) is not responding. Waited 5001ms for MotionEvent)\n"
    "Load: 2.31 / 1.87 / 1.52\n"
    "CPU usage from 0ms to 5012ms later (2023-11-14 22:13:19.010 to 2023-11-14 22:13:24.022):\n"
    "  98% 4300/com.example.maps: 97% user + 1% kernel / faults: 120 minor\n"
    "  12% 600/system_server: 8.1% user + 3.9% kernel / faults: 2048 minor\n"
)

_LIB = "/data/app/~~Qm9vaw==/com.example.mail-TWFpbA==/lib/x86_64/libmailcore.so"
_TOMBSTONE = (
    "*** *** *** *** *** *** *** *** *** *** *** *** *** *** *** ***\n",
    "Build fingerprint: 'ddmd/ddmdsim/ddmdsim:11/RSR1.201013.001/7:userdebug/test-keys'\n",
    "Revision: '0'\n",
    "ABI: 'x86_64'\n",
    "Timestamp: 2023-11-14 22:13:29.600000000+0000\n",
    f"pid: {MAIL_PID_2}, tid: {MAIL_PID_2}, name: om.example.mail  >>> {MAIL} <<<\n",
    f"uid: {MAIL_UID}\n",
    "signal 11 (SIGSEGV), code 1 (SEGV_MAPERR), fault addr 0x0\n",
    "Cause: null pointer dereference\n",
    "    rax 0000000000000000  rbx 00007ffd3c2e4a10  rcx 0000000000000001  rdx 0000000000000000\n",
    "\nbacktrace:\n",
    f"      #00 pc 000000000001a2b4  {_LIB} (parse_header+36)\n",
    f"      #01 pc 0000000000019f80  {_LIB} (Java_com_example_mail_Native_parse+64)\n",
    "      #02 pc 000000000013f1d0  /apex/com.android.art/lib64/libart.so"
    " (art_quick_generic_jni_trampoline+144)\n",
)


def _build() -> tuple[Recorded, ...]:
    rows: list[tuple[int, int, int, int, int, int, str, bytes, str | None, str | None, str | None]]
    # (ms, pid, tid, uid, lid, level, tag, message, app, about, crash)
    rows = [
        (10, WIFICOND_PID, 512, WIFI_UID, MAIN, _D, "wificond",
         b"wlan0: scan results ready (12 BSSs)", None, None, None),
        (100, SYSTEM_SERVER_PID, 632, SYSTEM_UID, SYSTEM, _I, "ActivityManager",
         _start(MAIL_PID, MAIL, MAIL_UID,
                "top-activity {com.example.mail/com.example.mail.MainActivity}"),
         None, MAIL, None),
        (250, MAIL_PID, 4242, MAIL_UID, MAIN, _D, "MailApp",
         b"onCreate: 2 accounts", MAIL, None, None),
        (400, SYSTEM_SERVER_PID, 632, SYSTEM_UID, SYSTEM, _I, "ActivityManager",
         _start(MAPS_PID, MAPS, MAPS_UID,
                "activity {com.example.maps/com.example.maps.MainActivity}"),
         None, MAPS, None),
        (550, MAPS_PID, 4300, MAPS_UID, MAIN, _D, "MapsApp", b"onCreate", MAPS, None, None),
        (700, MAIL_PID, 4257, MAIL_UID, MAIN, _V, "Mail Sync",
         b"poll tick: next in 300 s", MAIL, None, None),
        (850, MAPS_PID, 4312, MAPS_UID, MAIN, _I, "MapsRenderer",
         b"frame 1 drawn in 16 ms", MAPS, None, None),
        (1000, MAIL_PID, 4257, MAIL_UID, MAIN, _I, "MailSync",
         b"synced 3 folders:\n  INBOX 12 new\n  Sent 0 new\n  Spam 4 new", MAIL, None, None),
        (1150, MAPS_PID, 4315, MAPS_UID, MAIN, _W, "LocationService",
         b"GPS fix is stale (12 s); using the network location", MAPS, None, None),
        (1300, MAIL_PID, 4259, MAIL_UID, MAIN, _E, "MailStore",
         b"cannot decode header 'Subject: caf\xe9 cr\xe8me' (declared utf-8)", MAIL, None, None),
        (2000, SYSTEM_SERVER_PID, 632, SYSTEM_UID, SYSTEM, _I, "ActivityManager",
         f"Process {MAIL} (pid {MAIL_PID}) has died: cch+5 CEM".encode(), None, MAIL, "died"),
        (2500, SYSTEM_SERVER_PID, 632, SYSTEM_UID, SYSTEM, _I, "ActivityManager",
         _start(MAIL_PID_2, MAIL, MAIL_UID,
                "top-activity {com.example.mail/com.example.mail.MainActivity}"),
         None, MAIL, None),
        (2650, MAIL_PID_2, 4301, MAIL_UID, MAIN, _D, "MailApp",
         b"onCreate: 2 accounts", MAIL, None, None),
        (2800, MAIL_PID_2, 4318, MAIL_UID, MAIN, _I, "MailSync",
         b"resumed after restart: 3 folders", MAIL, None, None),
        (4000, SYSTEM_SERVER_PID, 640, SYSTEM_UID, SYSTEM, _E, "ActivityManager",
         _ANR.encode(), None, MAPS, "anr"),
        (6200, MAPS_PID, 4300, MAPS_UID, MAIN, _W, "MapsApp",
         b"main thread unblocked after 7.2 s", MAPS, None, None),
        (7000, MAPS_PID, 4300, MAPS_UID, CRASH, _E, "AndroidRuntime",
         _JAVA_CRASH.encode(), MAPS, None, "java"),
        (7010, SYSTEM_SERVER_PID, 641, SYSTEM_UID, SYSTEM, _W, "ActivityTaskManager",
         b"  Force finishing activity com.example.maps/.MainActivity", None, MAPS, None),
        (7050, MAPS_PID, 4300, MAPS_UID, MAIN, _I, "Process",
         f"Sending signal. PID: {MAPS_PID} SIG: 9".encode(), MAPS, None, None),
        (7300, SYSTEM_SERVER_PID, 632, SYSTEM_UID, SYSTEM, _I, "ActivityManager",
         f"Process {MAPS} (pid {MAPS_PID}) has died: fg  TOP".encode(), None, MAPS, "died"),
        (9000, MAIL_PID_2, 4318, MAIL_UID, MAIN, _D, "MailSync",
         b"fetching 2 messages", MAIL, None, None),
        (9500, MAIL_PID_2, MAIL_PID_2, MAIL_UID, CRASH, _F, "libc",
         f"Fatal signal 11 (SIGSEGV), code 1 (SEGV_MAPERR), fault addr 0x0 in tid {MAIL_PID_2}"
         f" (om.example.mail), pid {MAIL_PID_2} (om.example.mail)".encode(),
         MAIL, None, "native"),
    ]  # fmt: skip
    rows += [
        (9600 + 5 * n, CRASH_DUMP_PID, CRASH_DUMP_PID, MAIL_UID, CRASH, _F, "DEBUG",
         line.encode(), None, MAIL, "native")
        for n, line in enumerate(_TOMBSTONE)
    ]  # fmt: skip
    rows += [
        (10500, SYSTEM_SERVER_PID, 632, SYSTEM_UID, SYSTEM, _I, "ActivityManager",
         f"Process {MAIL} (pid {MAIL_PID_2}) has died: fg  TOP".encode(), None, MAIL, "died"),
        (12000, SYSTEM_SERVER_PID, 632, SYSTEM_UID, SYSTEM, _I, "ActivityManager",
         _start(OTHER_PID, OTHER, OTHER_UID,
                "broadcast {com.other.app/com.other.app.BootReceiver}"),
         None, OTHER, None),
        (12150, OTHER_PID, 4242, OTHER_UID, MAIN, _I, "OtherApp",
         b"BootReceiver: scheduling the daily job", OTHER, None, None),
        (12300, OTHER_PID, 4251, OTHER_UID, MAIN, _W, "OtherApp",
         b"job scheduler quota low (3 left)", OTHER, None, None),
        (12450, WIFICOND_PID, 512, WIFI_UID, MAIN, _D, "wificond",
         b"wlan0: scan results ready (9 BSSs)", None, None, None),
    ]  # fmt: skip
    out = []
    for index, (ms, pid, tid, uid, lid, level, tag, message, app, about, crash) in enumerate(rows):
        sec, nsec = _at(ms, index)
        record = Record(sec, nsec, pid, tid, level, tag, message, lid, uid)
        out.append(Recorded(record, app, about, crash))
    return tuple(out)


#: The recording, record by record, with what each is by design.
RECORDED: tuple[Recorded, ...] = _build()
RECORDS: tuple[Record, ...] = tuple(r.record for r in RECORDED)
#: Each record's bytes (v4 headers).
RECORD_BYTES: tuple[bytes, ...] = tuple(write_record(r) for r in RECORDS)
#: The whole stream, as ``logcat -B`` would print it.
STREAM: bytes = b"".join(RECORD_BYTES)


def entry_of(record: Record) -> LogEntry:
    """The entry the decoder must give for ``record`` (written here, not by the decoder):
    tag and message as UTF-8 with invalid bytes replaced, buffer and uid from the v4 header."""
    tag = record.tag if isinstance(record.tag, str) else record.tag.decode("utf-8", "replace")
    return LogEntry(
        sec=record.sec,
        nsec=record.nsec,
        pid=record.pid,
        tid=record.tid,
        level=record.level,
        tag=tag,
        message=record.message.decode("utf-8", "replace"),
        buffer=record.lid,
        uid=record.uid,
    )


#: What decoding `STREAM` gives, entry by entry.
ENTRIES: tuple[LogEntry, ...] = tuple(entry_of(r) for r in RECORDS)


def lines_of(app: str) -> tuple[int, ...]:
    """Indices of the entries written by ``app``'s processes (by pid, while the pid was the
    app's): what "the app's lines" means by design."""
    return tuple(i for i, r in enumerate(RECORDED) if r.app == app)


def lines_about(app: str) -> tuple[int, ...]:
    """`lines_of` plus the lines other processes wrote about ``app`` (ActivityManager's start,
    death and ANR lines, ActivityTaskManager's, the tombstone)."""
    return tuple(i for i, r in enumerate(RECORDED) if app in (r.app, r.about))


def crash_lines(kind: str, app: str | None = None) -> tuple[int, ...]:
    """Indices of the lines marked ``kind`` ("java", "native", "anr", "died"), of ``app``
    (written by or about it) if given."""
    return tuple(
        i
        for i, r in enumerate(RECORDED)
        if r.crash == kind and (app is None or app in (r.app, r.about))
    )
