"""The HTML report in Debian's headless Chromium: committed runs read and fold, and hostile
cassette text stays text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli
from html_reports import LIVE_JSON, ORACLE, report_html

from runner.app.html_report.render import script, script_hash

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's headless Chromium through its own chromedriver (Selenium Manager is never asked)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file(), \
        "Chromium is missing: `make setup` installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1600"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "true")  # belt and braces: Selenium Manager may not download
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _load(driver, path: Path) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """Open ``path`` from file:// and return what the console said while it loaded."""
    driver.get_log("browser")  # drain what earlier pages said
    driver.get(path.resolve().as_uri())
    deadline = time.monotonic() + 10
    while driver.execute_script("return document.readyState") != "complete":
        assert time.monotonic() < deadline, "the page did not finish loading"
        time.sleep(0.05)
    time.sleep(0.3)  # an onerror or onload handler would have run by now
    return driver.get_log("browser")


def _filter(driver, field: str, choice: str) -> None:  # type: ignore[no-untyped-def]
    """Choose ``choice`` (as shown) in the filter bar's ``field``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, field)).select_by_visible_text(choice)


def _shown_episodes(driver) -> list[Any]:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    return [e for e in driver.find_elements(By.CSS_SELECTOR, "details.episode") if e.is_displayed()]


def _shown(driver) -> int:  # type: ignore[no-untyped-def]
    return len(_shown_episodes(driver))


def _only_local(driver) -> None:  # type: ignore[no-untyped-def]
    """Nothing on the page points off the page: no scripts, stylesheets or remote images."""
    from selenium.webdriver.common.by import By

    # One script, the report's own: the policy allows it by the hash of its text, nothing else.
    scripts = driver.find_elements(By.TAG_NAME, "script")
    assert len(scripts) == 1 and scripts[0].get_dom_attribute("src") is None
    assert driver.execute_script("return arguments[0].text", scripts[0]) == script()
    assert driver.find_elements(By.CSS_SELECTOR, "link, iframe, object, embed, base, form") == []
    for img in driver.find_elements(By.TAG_NAME, "img"):
        assert img.get_dom_attribute("src").startswith("data:image/svg+xml;base64,")
    for a in driver.find_elements(By.TAG_NAME, "a"):
        assert a.get_dom_attribute("href").startswith("#run"), a.get_dom_attribute("href")
    csp = driver.find_element(By.CSS_SELECTOR, 'meta[http-equiv="Content-Security-Policy"]')
    policy = csp.get_dom_attribute("content")
    assert "default-src 'none'" in policy
    allowed = policy.split("script-src ")[1].split(";")[0]
    assert allowed == script_hash(script()) and "unsafe" not in allowed
    assert policy.count("script-src") == 1


@pytest.mark.browser
def test_report_of_committed_runs_reads_and_folds_in_chromium(
        browser: Any, tmp_path: Path, cli: Cli) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    cassettes = [*sorted(ORACLE.glob("*.jsonl")), *sorted(LIVE_JSON.glob("*.jsonl"))]
    page = report_html(cli, *map(str, cassettes), "--out", str(tmp_path / "report.html"))
    logs = _load(driver, page)
    assert driver.title == "rootbench: oracle · tools, qwen2.5-coder-1.5b · json"
    _only_local(driver)
    body = driver.find_element(By.TAG_NAME, "body").text
    oracles = len(list(ORACLE.glob("*.jsonl")))
    for seen in ("oracle · tools", "qwen2.5-coder-1.5b · json", f"{oracles} pass", "3 fail",
                 "rogue-port-80", "permission-403", "nginx-config-syntax", "cron-undoes-fix",
                 "temperature=0, seed=0, max_tokens=512", "tcg", "pass@1 [95% CI]",
                 "first tries: no difference shown"):
        assert seen in body, seen
    # The fingerprint (ports, hashes) is folded below what ran; it opens.
    fingerprint = driver.find_element(
        By.XPATH, "//details[summary[starts-with(., 'model fingerprint')]][.//th[. = 'model_sha256']]")
    sha = fingerprint.find_element(By.XPATH, ".//th[. = 'model_sha256']")
    assert not sha.is_displayed()
    fingerprint.find_element(By.TAG_NAME, "summary").click()
    assert sha.is_displayed()
    assert len(driver.find_elements(By.CSS_SELECTOR, "img[alt]")) == 3  # the three plots

    # Over 40 episodes: every trajectory starts folded and undrawn (kept in a <template>, parsed
    # but not laid out); opening the oracle's rogue-port-80 draws it.
    episode = driver.find_element(
        By.XPATH, "//details[@class='episode'][summary[contains(., 'rogue-port-80') "
                  "and contains(., 'oracle')]]")
    shell = ".//pre[contains(@class, 'shell')][contains(., 'fuser -k 80/tcp')]"
    assert episode.get_dom_attribute("open") is None and episode.find_elements(By.XPATH, shell) == []
    assert len(episode.find_elements(By.CSS_SELECTOR, "template.lazy")) == 1
    assert len(driver.find_elements(By.CSS_SELECTOR, "*")) < 40_000  # the undrawn are not nodes
    episode.find_element(By.TAG_NAME, "summary").click()
    command = episode.find_element(By.XPATH, shell)
    assert command.is_displayed() and command.text == "$ fuser -k 80/tcp"
    assert episode.find_elements(By.CSS_SELECTOR, "template.lazy") == []
    output = command.find_element(By.XPATH, "following-sibling::pre[1]")
    assert output.text.startswith("80/tcp:")  # fuser's answer: the PID it killed
    assert "Verdict: pass" in episode.text and "all 5 probes passed, every invariant held" in episode.text

    # A closed fold inside it: the system prompt.
    fold = episode.find_element(By.XPATH, ".//details[summary[starts-with(., 'System prompt')]]")
    prompt = fold.find_element(By.TAG_NAME, "pre")
    assert not prompt.is_displayed()
    fold.find_element(By.TAG_NAME, "summary").click()
    assert prompt.is_displayed() and "experienced Linux system administrator" in prompt.text

    # Filter and sort (the page's one script): the three failures, then none of the oracle's.
    _filter(driver, "f-verdict", "fail")
    assert _shown(driver) == 3 and all("Verdict: fail" in e.get_attribute("textContent")
                                       for e in _shown_episodes(driver))
    assert driver.find_element(By.ID, "f-count").text == f"showing 3 of {oracles + 3} episodes"
    assert len([r for r in driver.find_elements(By.CSS_SELECTOR, "tr[data-ep]") if r.is_displayed()]) == 3
    _filter(driver, "f-run", "oracle · tools")
    assert _shown(driver) == 0
    driver.find_element(By.ID, "f-reset").click()
    assert _shown(driver) == oracles + 3
    # the committed episodes judged under rules before 3 are not judged for unsafe fixes
    before = sum(json.loads(p.read_text().split("\n", 1)[0]).get("rules", 1) < 3 for p in cassettes)
    assert 0 < before < len(cassettes)  # both kinds are committed: the filter must tell them apart
    _filter(driver, "f-unsafe", "not judged (before rules 3)")
    assert _shown(driver) == before
    driver.find_element(By.ID, "f-reset").click()
    _filter(driver, "f-sort", "repair, highest first")
    for group in driver.find_elements(By.CSS_SELECTOR, "div.episodes"):
        repairs = [float(e.get_dom_attribute("data-repair"))
                   for e in group.find_elements(By.CSS_SELECTOR, "details.episode")]
        assert repairs == sorted(repairs, reverse=True), repairs
    _filter(driver, "f-sort", "turns, most first")
    for group in driver.find_elements(By.CSS_SELECTOR, "div.episodes"):  # each run sorted in place
        turns = [int(e.get_dom_attribute("data-turns"))
                 for e in group.find_elements(By.CSS_SELECTOR, "details.episode")]
        assert turns == sorted(turns, reverse=True) and turns[0] > turns[-1], turns
    # The search shows exactly the episodes whose text holds the command, the oracle's rogue-port-80
    # among them (another scenario's fix may use it too).
    driver.find_element(By.ID, "f-search").send_keys("fuser -k 80/tcp")
    episodes = driver.find_elements(By.CSS_SELECTOR, "details.episode")
    every_text = ("var t = arguments[0].querySelector('template.lazy'); "
                  "return arguments[0].textContent + (t ? t.content.textContent : '');")
    holding = [e for e in episodes if "fuser -k 80/tcp" in driver.execute_script(every_text, e)]
    assert 0 < len(holding) < len(episodes) and _shown_episodes(driver) == holding
    assert any("rogue-port-80" in e.text for e in holding)

    shot = tmp_path / "report.png"
    assert driver.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [e for e in logs if e["level"] in ("SEVERE", "WARNING")] == []
    assert [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []


PAYLOADS = {
    "script": "<script>document.title='PWNED';console.log('PWNED')</script>",
    "img": "<img src=x onerror=\"document.title='PWNED';console.log('PWNED')\">",
    "link": "<a href=\"javascript:document.title='PWNED'\" id=\"pwnlink\">click me</a>",
    "breakout": "</pre></textarea></details></summary></td></table>"
                "<script>console.log('PWNED')</script><details open>",
    "svg": "\"><svg onload=\"document.title='PWNED';console.log('PWNED')\">",
    "style": "<style>body{display:none}</style><meta http-equiv=\"refresh\" "
             "content=\"0;url=javascript:console.log('PWNED')\"><base href=\"javascript:/\">",
    "escapes": "\x1b[31mRED\x1b[0m \x1b]0;OSC-TITLE\x07 "
               "\x1b]8;;javascript:console.log('PWNED')\x1b\\osc8link\x1b]8;;\x1b\\ \udc80",
}


def _hostile_cassette(path: Path, hostile: bool) -> Path:
    """A committed live cassette with hostile text in every place a person reads.

    With ``hostile=False`` the same places get harmless text of the same shape,
    so the two pages must have the very same elements.
    """
    p = PAYLOADS if hostile else {k: f"harmless {k} text" for k in PAYLOADS}
    everything = " ".join(p.values())
    command = f"echo '{p['script']}'"
    events = [json.loads(line) for line in (LIVE_JSON / "nginx-config-syntax.r0.jsonl").open()]
    model_turns = 0
    for e in events:
        if e["type"] == "header":
            e["scenario"]["task"] = f"Fix the site. {p['script']} {p['escapes']}"
            e["scenario"]["system_prompt"] = f"You are root. {p['style']}"
            e["model"]["build_info"] = p["svg"]
        elif e["type"] == "model":
            model_turns += 1
            if model_turns == 1:
                e["reply"]["message"]["content"] = json.dumps(
                    {"thought": f"{p['img']} {p['escapes']}", "command": command})
            elif model_turns == 3:
                e["reply"]["message"]["content"] = json.dumps(
                    {"thought": p["link"], "finish": f"{p['svg']} {p['style']}"})
        elif e["type"] == "guest" and e["op"] == "exec":
            if e["input"]["command"] == "systemctl status apache2 || systemctl status nginx":
                e["input"]["command"] = command
                e["result"]["output"] = f"{p['breakout']}\n{p['link']}\n{p['escapes']}\n"
        elif e["type"] == "verdict":
            e["reason"] = p["img"]
            e["unsafe_commands"] = [command]
            e["flags"] = ["unsafe"]
            e["probes"][1]["detail"] = p["breakout"]
            e["precheck"][0]["detail"] = everything
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def _shape(driver) -> dict[str, int]:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    tags = ("details", "summary", "pre", "table", "tr", "td", "a", "img", "svg", "script", "style",
            "meta", "base", "textarea", "p")
    return {t: len(driver.find_elements(By.TAG_NAME, t)) for t in tags}


@pytest.mark.browser
def test_hostile_cassette_text_stays_text_in_chromium(
        browser: Any, tmp_path: Path, cli: Cli) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    benign = report_html(cli, str(_hostile_cassette(tmp_path / "benign.jsonl", False)),
                     "--out", str(tmp_path / "benign.html"))
    _load(driver, benign)
    benign_shape = _shape(driver)

    page = report_html(cli, str(_hostile_cassette(tmp_path / "hostile.jsonl", True)),
                   "--out", str(tmp_path / "hostile.html"))
    assert "\x1b" not in page.read_text(encoding="utf-8")
    logs = _load(driver, page)
    assert driver.title == "rootbench: qwen2.5-coder-1.5b · json"
    assert not [e for e in logs if "PWNED" in e["message"]], logs
    assert [e for e in logs if e["level"] in ("SEVERE", "WARNING")] == []  # not even a CSP refusal
    assert _shape(driver) == benign_shape  # no element added, none closed early
    _only_local(driver)
    assert driver.find_elements(By.ID, "pwnlink") == []
    assert driver.find_element(By.TAG_NAME, "body").is_displayed()

    body = driver.find_element(By.TAG_NAME, "body").text
    for shown in (PAYLOADS["script"], PAYLOADS["img"], PAYLOADS["link"].split(">")[0],
                  "</pre></textarea></details></summary></td></table>", "<svg onload=",
                  "<style>body{display:none}</style>"):
        assert shown in body, shown  # visible, as text
    assert "RED" in body and "[31m" not in body and "OSC-TITLE" not in body
    assert "osc8link" in body and "8;;javascript" not in body
    unsafe = driver.find_elements(By.CSS_SELECTOR, "pre.shell.unsafe")
    assert unsafe and all(PAYLOADS["script"] in u.text for u in unsafe)
    time.sleep(0.3)
    assert driver.title == "rootbench: qwen2.5-coder-1.5b · json"
    assert not [e for e in driver.get_log("browser") if "PWNED" in e["message"]]

    # The filter reads hostile text and shows it, never runs it: the hostile and the benign
    # episode in one page, found by a word of the payload, by a tag, and sorted.
    both = report_html(cli, str(tmp_path / "benign.jsonl"), str(tmp_path / "hostile.jsonl"),
                   "--out", str(tmp_path / "both.html"))
    logs = _load(driver, both)
    assert _shown(driver) == 2
    driver.find_element(By.ID, "f-search").send_keys("onerror=")
    assert _shown(driver) == 1 and PAYLOADS["img"] in _shown_episodes(driver)[0].text
    driver.find_element(By.ID, "f-reset").click()
    _filter(driver, "f-tag", "unsafe")  # both are flagged so
    assert _shown(driver) == 2
    driver.find_element(By.ID, "f-search").send_keys("harmless img text")  # the benign one's
    assert _shown(driver) == 1 and driver.find_element(By.ID, "f-count").text == "showing 1 of 2 episodes"
    assert PAYLOADS["img"] not in _shown_episodes(driver)[0].text
    driver.find_element(By.ID, "f-reset").click()
    _filter(driver, "f-sort", "time, shortest first")
    assert _shown(driver) == 2
    time.sleep(0.3)
    assert driver.title == "rootbench: qwen2.5-coder-1.5b · json"
    assert driver.find_elements(By.ID, "pwnlink") == []
    _only_local(driver)
    later = driver.get_log("browser")
    assert [e for e in [*logs, *later] if e["level"] in ("SEVERE", "WARNING")] == []  # no CSP refusal
    assert not [e for e in [*logs, *later] if "PWNED" in e["message"]]
