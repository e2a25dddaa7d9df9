"""The progress display (stacklib.reporting.progress): lines at the interval of an injected
clock, an estimate that follows the rate, nested steps, nothing on stdout, no control codes
without a terminal, nothing at all when no display is open."""

from __future__ import annotations

import io

import pytest

from stacklib.reporting import progress
from stacklib.reporting.progress import NULL_TASK, Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _plain(clock: FakeClock, stream: io.StringIO | None = None) -> Progress:
    return Progress(stream or io.StringIO(), clock=clock, interval=5.0, ticker=False)


def test_a_plain_line_comes_at_each_interval_and_not_before() -> None:
    clock = FakeClock()
    shown = _plain(clock)
    with shown.task("runs", total=10) as task:
        clock.now = 4.9
        task.advance()
        assert shown.lines == 0
        clock.now = 5.0
        task.advance()
        assert shown.lines == 1
        clock.now = 7.0
        task.advance()
        assert shown.lines == 1
        clock.now = 10.0
        shown.poll()  # what the ticker thread does while nothing advances
        assert shown.lines == 2
    text = shown.stream.getvalue()  # type: ignore[attr-defined]
    assert text.splitlines()[0].startswith("runs 2/10; 0:05 elapsed (20% of runs)")


def test_the_estimate_follows_the_rate() -> None:
    clock = FakeClock()
    shown = _plain(clock)
    with shown.task("points", total=100) as task:
        clock.now = 10.0
        task.advance(10)  # 10 points in 10 s: 90 s left
        assert "about 1:30 left" in shown.line(clock.now)[0]
        clock.now = 20.0
        task.advance(40)  # 50 in 20 s: 20 s left
        assert "about 0:20 left" in shown.line(clock.now)[0]


def test_nested_steps_are_named_and_the_whole_job_estimates() -> None:
    """The estimate is the outermost total's, counting the done part of the open steps: 1 of 3
    experiments plus a quarter of the second after a minute is 5/12 of the job."""
    clock = FakeClock()
    shown = _plain(clock)
    with shown.task("reproduce", total=3) as top:
        top.advance()
        with progress.step("Table 1 runs", total=4) as runs:
            assert progress.current() is runs
            clock.now = 60.0
            runs.advance()
            line, fraction = shown.line(clock.now)
            assert line.startswith("reproduce 1/3 > Table 1 runs 1/4; 1:00 elapsed")
            assert "(42% of reproduce), about 1:24 left" in line
            assert fraction == pytest.approx(5 / 12)
        assert progress.current() is top
    assert progress.current() is NULL_TASK


def test_a_weighted_step_counts_for_its_share_of_the_parent() -> None:
    """An experiment expected to take 8 of the job's 10 seconds, a quarter done: 20%."""
    clock = FakeClock()
    shown = _plain(clock)
    with (
        shown.task("reproduce", total=10) as top,
        top.step("long", weight=8),
        progress.step("points", total=4) as points,
    ):
        points.advance()
        clock.now = 10.0
        line, fraction = shown.line(clock.now)
    assert fraction == pytest.approx(0.2)
    assert "(20% of reproduce), about 0:40 left" in line
    with (
        pytest.raises(ValueError, match="weight must be >= 0"),
        shown.task("bad"),
        progress.step("negative", weight=-1),
    ):
        pass


def test_a_followed_sample_sets_the_work_done() -> None:
    clock = FakeClock()
    shown = _plain(clock)
    simulated = [0.0]
    with shown.task("virtual time", total=8.0, unit="s") as task:
        task.follow(lambda: simulated[0])
        simulated[0] = 2.0
        clock.now = 30.0
        line, _ = shown.line(clock.now)
    assert "virtual time 2/8 s" in line
    assert "about 1:30 left" in line


def test_nothing_is_written_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    shown = Progress(clock=clock, ticker=False)
    with shown.task("runs", total=2) as task:
        clock.now = 100.0
        task.advance()
        progress.message("a line above the bar")
    out, err = capsys.readouterr()
    assert out == ""
    assert "runs 1/2" in err
    assert "a line above the bar" in err


def test_no_control_codes_without_a_terminal() -> None:
    clock = FakeClock()
    stream = io.StringIO()
    shown = _plain(clock, stream)
    with shown.task("runs", total=3) as task:
        for _ in range(3):
            clock.now += 6
            task.advance()
        shown.message("done")
    text = stream.getvalue()
    assert text.count("\n") == 4
    assert not any(c in text for c in "\r\x1b\b")


def test_a_terminal_gets_a_bar_redrawn_in_place_and_cleared() -> None:
    clock = FakeClock()
    stream = Tty()
    shown = Progress(stream, clock=clock, use_rich=False, ticker=False)
    with shown.task("runs", total=4) as task:
        clock.now = 1.0
        task.advance(2)
    text = stream.getvalue()
    assert "\r[##########----------] runs 2/4" in text
    assert "\n" not in text
    assert text.endswith("\r")


def test_without_a_display_every_call_does_nothing() -> None:
    assert progress.current() is NULL_TASK
    with progress.step("runs", total=5) as task:
        assert task is NULL_TASK
        task.advance()
    assert NULL_TASK.done == 0


def test_quiet_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    with progress.shown("job", 1, quiet=True, stream=stream) as task:
        assert task is NULL_TASK
    monkeypatch.setenv("STACKLIB_PROGRESS", "off")
    with progress.shown("job", 1, stream=stream) as task:
        assert task is NULL_TASK
    assert stream.getvalue() == ""


def test_misuse_names_the_problem() -> None:
    with pytest.raises(ValueError, match="interval"):
        Progress(io.StringIO(), interval=0)
    with pytest.raises(ValueError, match="total"), Progress(io.StringIO()).task("x", total=-1):
        pass


def test_the_ticker_reports_while_nothing_advances() -> None:
    stream = io.StringIO()
    shown = Progress(stream, interval=0.01)
    with shown.task("one long run"):
        for _ in range(200):
            if shown.lines:
                break
            import time

            time.sleep(0.01)
    assert shown.lines >= 1
    assert "one long run" in stream.getvalue()


@pytest.mark.parametrize(("seconds", "text"), [(0, "0:00"), (61.4, "1:01"), (3725, "1:02:05")])
def test_durations(seconds: float, text: str) -> None:
    assert progress.duration(seconds) == text


def test_the_line_shows_the_virtual_time_of_the_running_simulation() -> None:
    import trio

    from stacklib.sim import Simulation

    clock = FakeClock()
    shown = _plain(clock)
    sim = Simulation(seed=1)

    async def main() -> str:
        await trio.sleep(2.5)
        return shown.line(clock.now)[0]

    with shown.task("trace record"):
        line = sim.run(main)
        after = shown.line(clock.now)[0]
    assert line == "trace record (t=2.5 s simulated); 0:00 elapsed"
    assert after == "trace record; 0:00 elapsed"  # no simulation runs any more


def test_a_rich_bar_leaves_stdout_alone(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rich", reason="rich is the optional extra stacklib[rich]")
    stream = Tty()
    shown = Progress(stream, clock=FakeClock(), ticker=False)
    with shown.task("runs", total=2) as task:
        task.advance()
        shown.report()
        progress.clear()
        print("the table")
        shown.report()
    assert capsys.readouterr().out == "the table\n"
    assert "runs 1/2" in stream.getvalue() and "the table" not in stream.getvalue()


def test_a_command_under_a_shown_display_becomes_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STACKLIB_PROGRESS", raising=False)
    stream = io.StringIO()
    with progress.shown("outer", stream=stream, ticker=False) as outer:
        with progress.shown("inner", 3) as inner:
            assert inner.parent is outer
            assert progress.current() is inner
        assert progress.current() is outer
    assert progress.current() is NULL_TASK
