"""The phases' and the matrix's progress bars: a timer thread that redraws only where someone watches (a terminal,
twice a second), since rich's default of ten redraws a second cost a tenth of a 32-trial driver's CPU."""
from __future__ import annotations

import io

from rich.console import Console

from gtep.orchestration.ray_search import progress_bar


def test_a_log_file_gets_no_redraw_timer_and_still_the_final_bar():
    out = io.StringIO()
    bar = progress_bar(Console(file=out, force_terminal=False, width=100))
    assert bar.live.auto_refresh is False
    with bar:
        task = bar.add_task("tune", total=4, status="")
        bar.update(task, completed=4, status="last: acc 0.500 (finished)")
        assert bar.live._refresh_thread is None  # noqa: SLF001 - the thread this test is about
    assert "4/4" in out.getvalue() and "last: acc 0.500" in out.getvalue()


def test_a_terminal_is_redrawn_twice_a_second():
    bar = progress_bar(Console(file=io.StringIO(), force_terminal=True, width=100))
    assert bar.live.auto_refresh is True and bar.live.refresh_per_second == 2
