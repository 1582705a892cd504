"""The console in a real headless Chromium (the distribution's, driven by Playwright):
each page loads against a live cluster and shows the numbers the SDK answers, the live
refresh runs and draws its plots, an action taken through the pages changes the cluster,
and a screenshot of each page is written to $RAFTMQ_SCREENSHOTS (else the test's tmp
dir). `make browser` installs Chromium and the driver; without them these tests skip."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.web.console.seeded import (
    GROUP,
    QUEUES,
    ROOT,
    TOPIC,
    Seeded,
    console_app,
    seeded_cluster,
    served,
)

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the browser tests need Playwright: `make browser`")

CHROMIUM_ENV = "RAFTMQ_CHROMIUM"
CHROMIUM = os.environ.get(CHROMIUM_ENV) or next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (`make browser` installs "
                       f"the distribution's; or set {CHROMIUM_ENV})"),
]

POLL_WAIT_MS = 15_000  # the page refreshes every 2 s; a loaded machine may be slow


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    with seeded_cluster(tmp_path_factory.mktemp("console-browser")) as s:
        yield s


@pytest.fixture(scope="module")
def url(seeded: Seeded) -> Iterator[str]:
    with served(console_app(seeded.settings)) as base:
        yield base


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wanted = os.environ.get("RAFTMQ_SCREENSHOTS")
    where = Path(wanted) if wanted else tmp_path_factory.mktemp("screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, url: str) -> Iterator[Any]:
    context = browser.new_context(base_url=url, viewport={"width": 1360, "height": 900},
                                  http_credentials={"username": ROOT.user,
                                                    "password": ROOT.password})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, f"the page's script failed: {errors}"


def live(page: Any) -> None:
    """Wait until the page refreshed from its JSON twin at least twice (rates need two)."""
    page.wait_for_function(
        "document.querySelectorAll('.uplot').length > 0 || "
        "!document.querySelector('[data-chart]')", timeout=POLL_WAIT_MS)
    page.wait_for_selector("#live-state.on", timeout=POLL_WAIT_MS)


def shoot(page: Any, shots: Path, name: str) -> None:
    path = shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000


def column(page: Any, table: str, index: int) -> list[str]:
    return [t.strip() for t in page.locator(f"#{table} tbody tr td:nth-child({index})")
            .all_inner_texts()]


def test_the_cluster_page_shows_leaders_and_draws_rates(seeded: Seeded, page: Any,
                                                        shots: Path) -> None:
    page.goto("/")
    live(page)
    leaders = seeded.cluster.leaders()
    groups = column(page, "groups", 1)
    assert sorted(groups) == sorted(leaders)
    assert column(page, "groups", 3) == [str(leaders[g]) for g in groups]
    assert set(column(page, "groups", 2)) == {"ok"}
    assert page.locator(".uplot canvas").count() == 1
    assert page.locator("#nodes-up").inner_text() == f"{len(seeded.cluster.node_ids)} / 3"
    shoot(page, shots, "cluster")


def test_the_topic_pages_show_the_sdks_offsets(seeded: Seeded, page: Any,
                                               shots: Path) -> None:
    with seeded.admin() as admin:
        info = admin.describe_topic(TOPIC)
    page.goto("/topics")
    assert TOPIC in column(page, "topics", 1)
    shoot(page, shots, "topics")
    page.click(f"#topics a:text-is('{TOPIC}')")
    live(page)
    assert column(page, "queues", 5) == [f"{q.end_offset:,}" for q in info.queues]
    assert len(column(page, "queues", 1)) == QUEUES
    assert page.locator("#stored").inner_text() == str(
        sum((q.end_offset or 0) - (q.min_offset or 0) for q in info.queues))
    shoot(page, shots, "topic")


def test_the_group_page_shows_lag_per_queue_over_time(seeded: Seeded, page: Any,
                                                      shots: Path) -> None:
    with seeded.admin() as admin:
        lags = admin.consumer_lag(GROUP, TOPIC)
    page.goto("/groups")
    shoot(page, shots, "groups")
    page.click(f"#groups a:text-is('{GROUP}')")
    live(page)
    assert column(page, "queues", 6) == [f"{lag.lag:,}" for lag in lags.values()]
    # one series per queue in the plot's legend
    legend = page.locator(".uplot .u-legend .u-series").all_inner_texts()
    assert sum(f"{TOPIC}/" in s for s in legend) == QUEUES
    shoot(page, shots, "group")


def test_the_message_transaction_user_and_chaos_pages(seeded: Seeded, page: Any,
                                                      shots: Path) -> None:
    page.goto("/messages")
    page.fill("#by-id input[name=id]", seeded.msg_ids[0])
    page.click("#by-id button")
    assert column(page, "messages", 1) == [seeded.msg_ids[0]]
    shoot(page, shots, "messages")
    page.goto("/transactions")
    assert seeded.txid in column(page, "halves", 1)
    shoot(page, shots, "transactions")
    page.goto("/users")
    assert "alice" in page.locator("#users").inner_text()
    shoot(page, shots, "users")
    page.goto("/chaos")
    shoot(page, shots, "chaos")


def test_creating_a_topic_through_the_pages_changes_the_cluster(seeded: Seeded, page: Any,
                                                                shots: Path) -> None:
    page.goto("/topics")
    page.fill("#create-topic input[name=topic]", "made-in-a-browser")
    page.fill("#create-topic input[name=queues]", "3")
    page.click("#create-topic button")
    assert "Create topic made-in-a-browser with 3 queue(s)" in page.inner_text("#summary")
    with seeded.admin() as admin:
        assert "made-in-a-browser" not in admin.list_topics()  # asked, not done
    shoot(page, shots, "confirm")
    page.click("#confirm")
    page.wait_for_selector("#done")
    with seeded.admin() as admin:
        assert admin.list_topics()["made-in-a-browser"]["queues"] == 3
