"""The chat page at `/` (issue 60) in a real headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium; no browser is downloaded) against real `spectool serve` processes on the tiny model: an answer streams,
coloured by source, and its coloured steps add up to the server's drafted and accepted counts; Stop ends the
stream; the race shows two speeds and "identical" at temperature 0; with --api-key the page asks for the key; a
reply holding markup shows as text; a server that went away gives a message. Each test keeps a screenshot in its
temporary folder. Without Chromium the tests fail: CI installs it (.ci/run)."""

import http.client
import json
import os
import re
import time
from pathlib import Path

import pytest
from spectool_lab.helpers import Server

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
PROMPT = "The quick brown fox jumps over the lazy dog. The quick"
# a reply the server's grammar forces: markup that would run if the page took model text as HTML
MARKUP = '<img src=x onerror="document.title=1"><script>document.title=2</script> **bold**\n```py\nx = 1\n```'
GRAMMAR = 'root ::= "' + MARKUP.replace('"', '\\"').replace("\n", "\\n") + '"'


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM.exists() and DRIVER.exists()):
        pytest.fail("Chromium is not installed: apt-get install chromium chromium-driver (.ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--window-size=1400,900", "--disable-gpu"):
        options.add_argument(arg)
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console: errors, CSP violations
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    # lookup drafts 3 tokens wherever it offers them, whatever this machine's costs say, from a cost cache of its
    # own (one that other tests' servers wrote could make every draft one token, and an answer with none refused)
    s = Server(tiny["target"], "--draft-min", "3", "--draft-max", "3", "--no-lookup-corpus",
               env={"SPECTOOL_CACHE": str(tmp_path_factory.mktemp("webui-cache"))})
    yield s
    _, err = s.stop()
    assert "Traceback" not in err and "error:" not in err, err


def open_page(driver, url):
    """The page, fresh: no conversations or settings kept from another test."""
    driver.get(url + "/")
    driver.execute_script("localStorage.clear(); sessionStorage.clear();")
    driver.get(url + "/")
    wait(driver, lambda: driver.find_element("id", "model").text not in ("", "…"), "the server panel")


def wait(driver, ready, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"the page never showed {what}")


def fill(driver, id_, value):
    element = driver.find_element("id", id_)
    element.clear()
    element.send_keys(str(value))


def send(driver, text):
    box = driver.find_element("id", "prompt")
    box.send_keys(text)
    box.send_keys("\n")  # Enter sends


def slot0(server) -> dict:
    return json.loads(server.request("GET", "/slots")[1])[0]


def summary(driver) -> str:
    return driver.execute_script("const s = document.querySelectorAll('.message.assistant .summary');"
                                 "return s.length ? s[s.length - 1].textContent : ''")


def test_the_page_and_its_headers_and_no_webui(server, tiny):
    """GET / is the page with a CSP that runs only its own script; its script and style are served; --no-webui
    makes GET / a 404 and leaves /health and HEAD / (which Claude Code sends first)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/")
    r = conn.getresponse()
    page = r.read().decode()
    assert r.status == 200 and r.getheader("content-type").startswith("text/html") and "<script src=" in page
    assert "script-src 'self'" in r.getheader("content-security-policy") and "unsafe-inline" not in page
    for path in ("/webui/app.js", "/webui/style.css"):
        assert server.request("GET", path)[0] == 200
    off = Server(tiny["target"], "--no-webui")
    try:
        assert off.request("GET", "/")[0] == 404 and off.request("GET", "/health")[0] == 200
        assert off.request("HEAD", "/")[0] == 200  # Claude Code's check before it starts
    finally:
        off.stop()


def test_an_answer_streams_and_its_coloured_steps_add_up_to_the_servers_counts(browser, server, tmp_path):
    open_page(browser, server.url)
    fill(browser, "max-tokens", 80)
    send(browser, PROMPT)
    line = wait(browser, lambda: summary(browser), "the summary line")
    browser.save_screenshot(str(tmp_path / "answer.png"))
    steps = browser.execute_script(
        "const seen = {}; for (const s of document.querySelectorAll('.message.assistant span[data-step]'))"
        " seen[s.dataset.step] = [Number(s.dataset.drafted), Number(s.dataset.accepted)]; return Object.values(seen)")
    drafted, accepted = sum(d for d, _ in steps), sum(a for _, a in steps)
    slot = slot0(server)  # the server's own counts of its last task
    assert (drafted, accepted) == (slot["draft_n"], slot["draft_n_accepted"]) and accepted > 0
    assert f"drafted {drafted}, accepted {accepted}" in line and "tok/s" in line
    assert browser.find_elements("css selector", ".message.assistant .src-lookup")  # drafts coloured as lookup's
    titles = browser.execute_script("return [...document.querySelectorAll('.message.assistant [data-step]')]"
                                    ".map((s) => s.title)")  # what hovering a step shows
    assert any("accepted draft:" in t for t in titles) and any("rejected draft:" in t for t in titles)
    assert browser.find_elements("css selector", "#positions .bar") and "%" in browser.find_element(
        "id", "fig-acceptance").text
    assert "slot 0" in browser.find_element("id", "slots").text
    requested = browser.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
    assert requested and all(u.startswith(server.url + "/") for u in requested), requested  # no other host
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # the page breaks neither its own CSP nor anything else


def test_conversations_keys_settings_and_theme(browser, server, tmp_path):
    """Shift+Enter adds a line and Enter sends; speculation off for a request drafts nothing; conversations are
    kept in the browser, renamed and deleted; the theme follows the system's dark or light."""
    from selenium.webdriver.common.keys import Keys

    open_page(browser, server.url)
    fill(browser, "max-tokens", 8)
    browser.find_element("id", "speculative").click()  # off
    box = browser.find_element("id", "prompt")
    box.send_keys("a", Keys.SHIFT, Keys.ENTER, Keys.SHIFT, "b", Keys.ENTER)
    line = wait(browser, lambda: summary(browser), "the summary line")
    assert browser.find_element("css selector", ".message.user").text.endswith("a\nb") and "[none]" in line
    assert "drafted 0," in line
    browser.execute_cdp_cmd("Browser.grantPermissions", {"permissions": ["clipboardReadWrite",
                                                                         "clipboardSanitizedWrite"]})
    browser.find_element("css selector", ".message.assistant .copy").click()
    wait(browser, lambda: browser.find_element("css selector", ".message.assistant .copy").text == "Copied", "copied")
    copied = browser.execute_async_script("navigator.clipboard.readText().then(arguments[0])")
    assert copied and copied == browser.execute_script("return JSON.parse(localStorage.getItem('spectool.chats'))"
                                                       "[0].messages[1].content")
    browser.find_element("id", "new-chat").click()
    browser.find_elements("css selector", "#chat-list .rename")[0].click()
    browser.switch_to.alert.send_keys("renamed")
    browser.switch_to.alert.accept()
    titles = [e.text for e in browser.find_elements("css selector", "#chat-list .open")]
    assert len(titles) == 2 and titles[0] == "renamed", titles
    browser.refresh()  # kept in localStorage
    wait(browser, lambda: len(browser.find_elements("css selector", "#chat-list li")) == 2, "two conversations")
    browser.find_elements("css selector", "#chat-list .delete")[0].click()
    assert [e.text for e in browser.find_elements("css selector", "#chat-list .open")] != ["renamed"]  # (one left)
    browser.find_elements("css selector", "#chat-list .open")[0].click()
    assert browser.find_elements("css selector", ".message.assistant")
    colours = []
    for scheme in ("light", "dark"):
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme",
                                                                             "value": scheme}]})
        colours.append(browser.execute_script("return getComputedStyle(document.body).backgroundColor"))
        browser.save_screenshot(str(tmp_path / f"{scheme}.png"))
    assert colours == ["rgb(255, 255, 255)", "rgb(23, 25, 29)"]
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_stop_ends_the_stream(browser, server, tmp_path):
    open_page(browser, server.url)
    fill(browser, "max-tokens", 900)
    # the tiny model can stream all 900 tokens before a click lands (the clean-clone CI of 0f5778e saw no
    # "(stopped)"): the page reads the stream at 4 KB/s (Chrome's network emulation), so Stop finds it streaming
    browser.set_network_conditions(latency=1, download_throughput=4096, upload_throughput=1 << 20)
    try:
        send(browser, "Once upon a time")
        wait(browser, lambda: len(browser.find_element("css selector", ".message.assistant .body").text) > 5, "text")
        browser.find_element("id", "stop").click()
        wait(browser, lambda: "(stopped)" in browser.find_element("css selector", ".message.assistant").text,
             "stopped")
    finally:
        browser.delete_network_conditions()
    browser.save_screenshot(str(tmp_path / "stopped.png"))
    wait(browser, lambda: not slot0(server)["is_processing"], "the slot free", 10)
    assert browser.find_element("id", "send").is_enabled() and not summary(browser)


def test_the_race_shows_two_speeds_and_identical_at_temperature_0(browser, server, tmp_path):
    open_page(browser, server.url)
    fill(browser, "temperature", 0)
    fill(browser, "max-tokens", 60)
    browser.find_element("id", "race").click()  # nothing to race yet
    assert "type a prompt first" in browser.find_element("id", "race-ratio").text
    browser.find_element("id", "prompt").send_keys(PROMPT)
    browser.find_element("id", "race").click()
    same = wait(browser, lambda: browser.find_element("id", "race-same").text, "the race's verdict", 90)
    browser.save_screenshot(str(tmp_path / "race.png"))
    speeds = [e.text for e in browser.find_elements("css selector", ".race-speed")]
    assert same == "identical" and all(re.match(r"[\d.]+ tok/s", s) for s in speeds) and len(speeds) == 2
    assert re.match(r"[\d.]+x \(one after the other\)", browser.find_element("id", "race-ratio").text)


def test_the_key_is_asked_once_and_markup_in_a_reply_shows_as_text(browser, tiny, tmp_path):
    """With --api-key the page asks for the key, keeps it for the tab and sends it; a reply the grammar forces to
    be an <img onerror> and a <script> shows as those characters, and neither runs."""
    s = Server(tiny["target"], "--api-key", "s3cret", "--grammar", GRAMMAR)
    try:
        browser.get(s.url + "/")
        browser.execute_script("localStorage.clear(); sessionStorage.clear();")
        browser.get(s.url + "/")
        wait(browser, lambda: browser.find_element("id", "key-dialog").is_displayed(), "the key's dialog")
        browser.find_element("id", "key-input").send_keys("s3cret\n")
        wait(browser, lambda: browser.find_element("id", "model").text == "target", "the model after the key")
        assert browser.execute_script("return sessionStorage.getItem('spectool.key')") == "s3cret"
        browser.refresh()  # asked once: the tab keeps it
        wait(browser, lambda: browser.find_element("id", "model").text == "target", "the model after a reload")
        assert not browser.find_element("id", "key-dialog").is_displayed()
        send(browser, "hi")
        wait(browser, lambda: summary(browser), "the summary line")
        browser.save_screenshot(str(tmp_path / "markup.png"))
        body = browser.find_element("css selector", ".message.assistant .body")
        assert '<img src=x onerror="document.title=1"><script>document.title=2</script>' in body.text
        assert not body.find_elements("css selector", "img, script") and body.find_elements("css selector", "strong")
        assert body.find_element("css selector", ".codeblock pre code").text == "x = 1"  # Markdown's code block
        assert browser.title == "spectool"  # neither handler ran
    finally:
        s.stop()


def test_a_server_that_went_away_gives_a_message(browser, tiny, tmp_path):
    s = Server(tiny["target"])
    open_page(browser, s.url)
    s.stop()
    send(browser, "hello")
    error = wait(browser, lambda: browser.find_element("id", "error").text, "an error message")
    browser.save_screenshot(str(tmp_path / "gone.png"))
    assert "not answering" in error and "error:" in browser.find_element("css selector", ".message.assistant").text


def test_the_race_runs_side_by_side_with_two_slots(browser, tiny, tmp_path):
    """With --parallel 2, /props' total_slots tells the page to race both requests at once."""
    s = Server(tiny["target"], "-c", "2048", "--parallel", "2", "--draft-min", "1")
    try:
        open_page(browser, s.url)
        fill(browser, "max-tokens", 40)
        browser.find_element("id", "prompt").send_keys(PROMPT)
        browser.find_element("id", "race").click()
        same = wait(browser, lambda: browser.find_element("id", "race-same").text, "the race's verdict", 90)
        browser.save_screenshot(str(tmp_path / "race-parallel.png"))
        assert same == "identical" and "(side by side)" in browser.find_element("id", "race-ratio").text
    finally:
        s.stop()


EIFFEL = ("Text: The Eiffel Tower was completed in 1889 for the World's Fair in Paris. It is 330 metres tall and was the "
          "tallest man-made structure in the world for 41 years. Question: When was the Eiffel Tower completed, and how "
          "tall is it?")


@pytest.mark.realmodel
def test_the_demo_models_answer_and_race(browser, gemma_q4, tmp_path):
    """The demo model (Gemma 3 270M) answers the README's question with lookup's drafts coloured, and the race
    against plain decoding is identical at temperature 0. This test makes docs/webui.png, the README's screenshot:
    SPECTOOL_WEBUI_SHOT=docs/webui.png pytest tests/test_webui.py -k demo."""
    s = Server(gemma_q4)
    try:
        open_page(browser, s.url)
        fill(browser, "max-tokens", 40)
        send(browser, EIFFEL)
        wait(browser, lambda: summary(browser), "the summary line", 120)
        assert browser.find_elements("css selector", ".message.assistant .src-lookup")
        browser.find_element("id", "prompt").send_keys(EIFFEL)
        browser.find_element("id", "race").click()
        assert wait(browser, lambda: browser.find_element("id", "race-same").text, "the race's verdict", 120) == \
            "identical"
        browser.save_screenshot(str(tmp_path / "demo.png"))
        if os.environ.get("SPECTOOL_WEBUI_SHOT"):
            browser.save_screenshot(os.environ["SPECTOOL_WEBUI_SHOT"])
    finally:
        s.stop()
