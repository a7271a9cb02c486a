"""Long work reports progress: log lines when not on a terminal (as here)."""

from __future__ import annotations

import logging

from simlab.engines.replay import replay_step
from simlab.engines.step import RequestStep
from tests.fixtures import chat_trace, model, policy_plugins
from traces.progress import Progress


def test_progress_logs_a_line_per_interval_off_a_terminal(caplog):
    caplog.set_level(logging.INFO, logger="traces.progress")
    with Progress(1000, "work", every_s=0.0, check_every=100) as progress:
        for _ in range(1000):
            progress.update()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10 and lines[-1].startswith("work: 1000/1000 (")


def test_a_replay_shows_nothing_when_short(caplog):
    caplog.set_level(logging.INFO, logger="traces.progress")
    admission, eviction = policy_plugins("sglang_plus")
    step = RequestStep.build(model("llama3_8b"), 1e9, admission, eviction, "sglang_plus")
    replay_step(list(chat_trace(seed=1).requests()), step)
    assert caplog.records == []
