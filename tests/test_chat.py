"""Chat: template rendering in the sandbox, KV reuse across turns, the REPL in a real terminal (tmux)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from spectool.cli.chat import Chat
from spectool.templates import TemplateError, render
from spectool.cli import app
from spectool.drafters.lookup import PromptLookup
from spectool.generate.loop import GenerationConfig


def test_render_uses_the_template_and_the_fallback():
    msgs = [{"role": "user", "content": "hi"}]
    t = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    assert render(t, msgs, add_generation_prompt=True) == "<user>hi<a>"
    assert render(None, msgs, add_generation_prompt=True) == "User: hi\nAssistant:"


@pytest.mark.parametrize("evil", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.append(1) }}",
    "{{ cycler.__init__.__globals__.os.system('echo pwned') }}",
])
def test_template_cannot_reach_python_internals(evil):
    with pytest.raises(TemplateError):
        render(evil, [{"role": "user", "content": "x"}], add_generation_prompt=True)


def test_template_raise_exception_is_a_clear_error():
    with pytest.raises(TemplateError, match="roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}", [], add_generation_prompt=True)


def test_second_turn_prefills_only_its_new_tokens(target):
    target.reset()
    chat = Chat(GenerationConfig(target, PromptLookup(), max_tokens=12))
    first = "".join(t for t, _ in chat.send("The quick brown fox"))
    assert chat.turns[0].n_prefilled == chat.turns[0].n_prompt_tokens - 1
    second = "".join(t for t, _ in chat.send("and the lazy dog"))
    s2 = chat.turns[1]
    new_text = render(chat.template, chat.messages[:-1], add_generation_prompt=True)
    n_new = len(target.tokenize(new_text[len(render(chat.template, chat.messages[:1], add_generation_prompt=True)
                                              + first):], add_special=False, parse_special=True))
    # the previous prompt and reply stay in the cache: only the last reply token and the new turn are decoded
    assert s2.n_prefilled == n_new
    assert s2.n_prompt_tokens > 3 * s2.n_prefilled
    assert second and chat.messages[-1]["content"] == second and chat.messages[-2]["content"] == "and the lazy dog"


def test_reset_and_system(target):
    chat = Chat(GenerationConfig(target, None, max_tokens=5), system="be brief")
    list(chat.send("hello"))
    assert chat.messages[0] == {"role": "system", "content": "be brief"} and len(chat.messages) == 3
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "be brief"}] and chat.tokens == []
    chat.set_system("")
    assert chat.messages == []


def test_chat_with_cli_runner(tiny):
    r = CliRunner().invoke(app, ["chat", "-m", str(tiny["target"]), "-n", "8"],
                           input="The quick brown fox\n/stats\n/reset\n/help\n/bogus\n/exit\n")
    assert r.exit_code == 0, r.output
    assert "prefilled" in r.stderr and "conversation cleared" in r.stderr and "/system TEXT" in r.stderr
    assert "unknown command /bogus" in r.stderr


class Pane:
    """A real terminal: `cmd` runs in a tmux pane of its own; its exit status is kept in a file."""

    def __init__(self, tmp_path, cmd: str, width: int = 150, height: int = 50):
        self.tmux, self.done = ["tmux", "-S", str(tmp_path / "tmux.sock")], tmp_path / "exit_code"
        subprocess.run([*self.tmux, "new-session", "-d", "-x", str(width), "-y", str(height),
                        f"{cmd}; echo $? > {self.done}"], check=True, env=os.environ)

    def screen(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-S", "-500"], capture_output=True, text=True).stdout

    def wait_for(self, text: str, count: int = 1, timeout: float = 40) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if self.screen().count(text) >= count:
                return
            time.sleep(0.1)
        raise AssertionError(f"{text!r} x{count} never appeared:\n{self.screen()}")

    def send(self, line: str) -> None:
        subprocess.run([*self.tmux, "send-keys", line, "Enter"], check=True)

    def exit_code(self, timeout: float = 20, while_waiting=lambda: None) -> str:
        end = time.time() + timeout
        while not self.done.exists() and time.time() < end:
            while_waiting()
            time.sleep(0.1)
        return self.done.read_text().strip()

    def __enter__(self) -> "Pane":
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


# The tiny models' chats run on one thread (-t 1). With as many threads as cores (the default), every decode waits at
# each graph node for all its threads (ggml under OpenMP), so on a 2-core machine that other processes keep busy a
# 12-token reply took 0.1-9.4 s against 0.01-0.02 s on one thread (issue 58 item 13: a suite run's second turn
# printed "." and nothing more for 40 s). No lock: slow scheduling.
TINY_CHAT = f"{sys.executable} -m spectool chat -t 1"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_chat_in_a_real_terminal(tiny, tmp_path):
    cmd = f"{TINY_CHAT} -m {tiny['target']} -md {tiny['draft']} -n 12"
    with Pane(tmp_path, cmd, 120, 40) as pane:
        pane.wait_for("/help for commands")
        pane.send("The quick brown fox")
        pane.wait_for("tok/s", 1)
        pane.send("and the lazy dog")
        pane.wait_for("tok/s", 2)
        pane.send("/stats")
        pane.wait_for("prefilled")
        pane.wait_for("session: 2 replies")
        pane.send("/reset")
        pane.wait_for("conversation cleared")
        pane.send("/exit")
        assert pane.exit_code() == "0"


@pytest.mark.realmodel
def test_ctrl_c_during_run_keeps_the_text_and_exits_130(gemma_q4, tmp_path):
    stats = tmp_path / "s.json"
    p = subprocess.Popen(
        [sys.executable, "-m", "spectool", "run", "-m", str(gemma_q4), "-n", "3000", "-t", "2",
         "--stats-json", str(stats), "Write a very long story about a dragon."],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    first = p.stdout.read(1)  # generation has started
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    out = first + out
    assert p.returncode == 130, err
    import json

    j = json.loads(stats.read_text())
    assert j["finish_reason"] == "interrupted" and 0 < j["n_generated"] < 3000
    assert out.endswith(b"\n") and len(out) > 10
    assert b"finish: interrupted" in err and b"Traceback" not in err


def test_a_seeded_chat_does_not_replay_its_random_stream(target):
    from spectool.core.controller import Controller
    from spectool.core.verify import Sampling

    def replies(seed):
        chat = Chat(GenerationConfig(target, PromptLookup(), Sampling(1.0), Controller(timed=False), max_tokens=20,
                               seed=seed))
        out = []
        for _ in range(3):
            out.append("".join(t for t, _ in chat.send("The quick brown fox")))
            chat.reset()
        return out

    first = replies(3)
    assert first == replies(3)  # a seeded session reproduces ...
    assert len(set(first)) == 3  # ... but the same conversation, asked again, draws anew


def test_a_long_chat_drops_its_oldest_turns_and_keeps_the_system_prompt(tiny):
    from spectool.llama.engine import EngineError, Model

    with Model(tiny["target"], n_ctx=256) as m:  # llama.cpp's smallest context
        chat = Chat(GenerationConfig(m, PromptLookup(), max_tokens=40), system="be brief")
        line = "The quick brown fox jumps over the lazy dog and runs into the woods"
        notices = []
        for i in range(8):
            steps = list(chat.send(f"{i}: {line}"))
            notices += [s.notice for _, s in steps if s.notice]
            assert chat.turns[-1].finish_reason in ("length", "stop")
        assert notices and all("dropped the" in n and "256 tokens" in n for n in notices)
        assert chat.messages[0] == {"role": "system", "content": "be brief"}
        assert chat.messages[-2]["content"] == f"7: {line}" and len(chat.messages) < 1 + 2 * 8
        assert chat.turns[-1].n_prompt_tokens + 40 <= 256
        with pytest.raises(EngineError, match="shorten it"):
            list(chat.send(line * 30))  # one message that cannot fit alone


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_chat_that_outgrows_the_context_goes_on_in_a_real_terminal(tiny, tmp_path):
    cmd = f"{TINY_CHAT} -m {tiny['target']} -c 256 -n 40 --temp 0 --system 'be brief'"
    with Pane(tmp_path, cmd) as pane:
        pane.wait_for("/help for commands")
        for i in range(1, 7):
            pane.send(f"{i}: The quick brown fox jumps over the lazy dog")
            pane.wait_for("tok/s", i)
        pane.wait_for("dropped the")
        assert "error" not in pane.screen().lower()
        pane.send("/exit")
        assert pane.exit_code() == "0"


@pytest.mark.realmodel
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_long_prompt_shows_its_progress_in_a_real_terminal(gemma_q4, tmp_path):
    """`cat big.md | spectool run "Summarize:"` spends seconds in prompt processing: a bar says how far it is."""
    from pathlib import Path

    big = tmp_path / "big.md"
    big.write_text((Path(__file__).resolve().parents[1] / "README.md").read_text()[:6000])
    cmd = f"cat {big} | {sys.executable} -m spectool run -m {gemma_q4} -t 2 -n 4 'Summarize:' > /dev/null"
    seen = []
    with Pane(tmp_path, cmd, 150, 40) as pane:
        assert pane.exit_code(120, while_waiting=lambda: seen.append(pane.screen())) == "0"
    bar = [line for s in seen for line in s.splitlines() if line.lstrip().startswith("prompt") and "tokens/s" in line]
    assert bar, seen[-1] if seen else "no screen"
    done_tokens, total = bar[-1].split("tokens")[0].split()[-1].split("/")
    assert 0 < int(done_tokens) <= int(total) and int(total) > 1000


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.parametrize("after_a_reply", [False, True])
def test_sigterm_at_the_idle_prompt_exits_143(tiny, tmp_path, after_a_reply):
    """SIGTERM while chat waits for a line ends it with 143, as it does during a reply (it used to print the
    prompt again and stay)."""
    pid = tmp_path / "pid"
    cmd = f"bash -c 'echo $$ > {pid}; exec {TINY_CHAT} -m {tiny['target']} -n 8'"
    with Pane(tmp_path, cmd) as pane:
        pane.wait_for("/help for commands")
        if after_a_reply:
            pane.send("The quick brown fox")
            pane.wait_for("tok/s")
        time.sleep(0.5)  # at input()
        os.kill(int(pid.read_text()), signal.SIGTERM)
        assert pane.exit_code() == "143", pane.screen()
        assert "Traceback" not in pane.screen()


def test_a_message_too_long_for_the_context_is_refused_and_the_conversation_kept(tiny):
    """Issue 58 item 7: a message that cannot fit even alone dropped every earlier turn before it was refused, so
    the next message had lost the history. Now the conversation, its tokens and the KV cache stay as they were,
    and the next turn prefills only its own tokens."""
    from spectool.llama.engine import EngineError, Model

    with Model(tiny["target"], n_ctx=256) as m:
        chat = Chat(GenerationConfig(m, PromptLookup(), max_tokens=20), system="be brief")
        for line in ("The quick brown fox", "jumps over the lazy dog"):
            list(chat.send(line))
        kept = (chat.messages[:], chat.tokens[:], chat.anchor, list(m.tokens))
        with pytest.raises(EngineError, match="shorten it"):
            list(chat.send("The quick brown fox jumps over the lazy dog " * 30))
        assert (chat.messages, chat.tokens, chat.anchor, list(m.tokens)) == kept and len(chat.turns) == 2
        list(chat.send("and runs"))
        assert chat.messages[:5] == kept[0] and len(chat.messages) == 7
        assert chat.turns[-1].n_prefilled < chat.turns[-1].n_prompt_tokens // 2


def test_chat_refuses_a_message_too_long_in_one_line_and_goes_on(tiny):
    r = CliRunner().invoke(app, ["chat", "-m", str(tiny["target"]), "-c", "256", "-n", "8", "--temp", "0"],
                           input="The quick brown fox\n" + "jumps over the lazy dog " * 80 + "\nand runs\n/stats\n")
    assert r.exit_code == 0, r.output
    assert sum("shorten it" in line for line in r.stderr.splitlines()) == 1
    assert "session: 2 replies" in r.stderr and "Traceback" not in r.stderr
