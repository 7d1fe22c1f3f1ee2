"""The quick read of thread-state polls (``thread_status_rows`` + ``VmModel.apply_thread_rows``)
gives exactly the threads the general decoder and ``apply_thread_status`` give, and says when
nothing changed, so a monitor of many VMs does not rebuild (or announce) unchanged tables."""

from __future__ import annotations

from ddmd.protocol import ddm
from ddmd.session.model import VmModel


def thst(*entries: tuple[int, int, int, int, int, bool]) -> ddm.ThreadStatus:
    return ddm.ThreadStatus(tuple(ddm.ThreadInfo(*e) for e in entries))


def reply_data(*chunks: ddm.Chunk) -> bytes:
    return b"".join(ddm.encode_chunk(c) for c in chunks)


def both(models: tuple[VmModel, VmModel], chunk: ddm.Chunk) -> bool:
    """Apply ``chunk`` to the general model and its rows to the quick one; return 'changed'."""
    general, quick = models
    general.apply(chunk)
    rows = ddm.thread_status_rows(reply_data(chunk))
    assert rows is not None
    changed = quick.apply_thread_rows(rows)
    assert quick.thread_tuple() == general.thread_tuple()
    return changed


def notice(models: tuple[VmModel, VmModel], chunk: ddm.Chunk) -> None:
    for model in models:
        model.apply(chunk)


def test_quick_reads_match_the_general_decoder_through_notices_and_repeats() -> None:
    models = (VmModel(), VmModel())
    notice(models, ddm.ThreadCreated(1, "main"))
    notice(models, ddm.ThreadCreated(2, "worker"))
    first = thst((1, 1, 100, 5, 1, False), (2, 4, 101, 0, 0, True))
    assert both(models, first)
    assert not both(models, first)  # the same bytes again: nothing changed
    # One thread's CPU time moves: changed, and only that entry differs.
    assert both(models, thst((1, 1, 100, 6, 1, False), (2, 4, 101, 0, 0, True)))
    # A rename between polls (the notice was the change): the repeated entry keeps the name.
    notice(models, ddm.ThreadRenamed(2, "pool-1"))
    assert not both(models, thst((1, 1, 100, 6, 1, False), (2, 4, 101, 0, 0, True)))
    assert models[1].threads[2].name == "pool-1"
    # A thread dies and its id comes back as a new thread with the same entry bytes.
    notice(models, ddm.ThreadDied(2))
    notice(models, ddm.ThreadCreated(2, "reborn"))  # a fresh snapshot, states unknown
    assert both(models, thst((1, 1, 100, 6, 1, False), (2, 4, 101, 0, 0, True)))
    assert models[1].threads[2].name == "reborn"
    # A thread missing from the poll is gone from the table.
    assert both(models, thst((1, 1, 100, 6, 1, False)))
    assert list(models[1].threads) == [1]


def test_a_new_connection_forgets_the_remembered_entries() -> None:
    model = VmModel()
    chunk = thst((1, 1, 100, 5, 1, False))
    rows = ddm.thread_status_rows(reply_data(chunk))
    assert rows is not None
    assert model.apply_thread_rows(rows)
    model.forget_threads()
    assert model.apply_thread_rows(rows)  # known again: a change, not a repeat
    assert model.thread_tuple() is not None
    assert len(model.thread_tuple() or ()) == 1


def test_only_one_whole_shipped_chunk_takes_the_quick_read() -> None:
    shipped = thst((1, 1, 100, 5, 1, False))
    draft = ddm.ThreadStatusDraft((ddm.DraftThreadInfo(1, 1, False),))
    assert ddm.thread_status_rows(reply_data(shipped)) == [
        (1, reply_data(shipped)[12:30]),
    ]
    assert ddm.thread_status_rows(reply_data(draft)) is None
    assert ddm.thread_status_rows(reply_data(shipped, shipped)) is None
    assert ddm.thread_status_rows(reply_data(shipped)[:-1]) is None
    assert ddm.thread_status_rows(reply_data(ddm.ThreadCreated(1, "x"))) is None
    # Wider entries (a future VM adding fields) are read by their declared width.
    wide = ddm.ThreadStatus((ddm.ThreadInfo(7, 2, 1, 2, 3, True),), entry_length=22)
    rows = ddm.thread_status_rows(reply_data(wide))
    assert rows is not None
    assert ddm.thread_info(rows[0][1]) == wide.threads[0]
