"""Drives a running `nx serve` with the official `openai` Python client (gate SERVE-OPENAI).

Usage: python serve_openai.py --base-url http://127.0.0.1:PORT/v1 --model ID [--real]

Every check prints one line (`ok   NAME: ...`); the first failure prints `FAIL NAME: ...`
and exits 1. `--real` asks in plain English, for a real model (the default prompts suit
the tiny test model's vocabulary). The server is expected to run with a context of at
least 256 positions and at most 1024 (the overflow check sends about 1100 tokens).
"""

import argparse
import json
import sys
import time
import urllib.request

import openai

# Prompts per model: the tiny model's vocabulary is letters and a few lower-case words; a
# real model is asked something it continues with ordinary text.
PROMPTS = {
    "tiny": {
        "cmpl": "the cat sat",
        "cmpl2": "the dog ran",
        "short": "the sun",
        "chat": "the cat",
        "stop_cmpl": "the moon and the star",
        "stop_chat": "the dog",
        "seed": "the sky",
        "n": "the day",
    },
    "real": {
        "cmpl": "The capital of France is",
        "cmpl2": "Water boils at",
        "short": "Hello",
        "chat": "Write one sentence about the sea.",
        "stop_cmpl": "The planets of the solar system are Mercury,",
        "stop_chat": "Name three colors.",
        "seed": "Once upon a time",
        "n": "My favourite food is",
        "json": "Describe a cat as JSON with the keys name and age.",
    },
}

# Long enough to overflow a context of 1024 positions in any vocabulary nx serves here.
LONG_PROMPT = " ".join(["the cat sat on the mat and the dog ran far away"] * 100)


class CheckFailed(Exception):
    pass


def expect(cond, message):
    if not cond:
        raise CheckFailed(message)


def eq(got, want, what):
    expect(got == want, f"{what}: got {got!r}, want {want!r}")


class Checks:
    def __init__(self, base_url, model, prompts):
        self.base_url = base_url.rstrip("/")
        self.root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        self.model = model
        self.p = prompts
        self.client = openai.OpenAI(base_url=self.base_url, api_key="nx", max_retries=0, timeout=120)
        self.greedy_cache = {}

    # Helpers --------------------------------------------------------------------------

    def raw_post(self, path, body):
        req = urllib.request.Request(
            self.root + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def prompt_tokens(self, text):
        """Tokens of a completion prompt as the server counts them (BOS included)."""
        ids = self.raw_post("/tokenize", {"content": text, "add_special": True, "parse_special": False})
        return len(ids["tokens"])

    def complete(self, prompt, **kw):
        return self.client.completions.create(model=self.model, prompt=prompt, **kw)

    def chat(self, content, **kw):
        return self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": content}], **kw
        )

    def greedy_completion(self, prompt, n):
        key = ("cmpl", prompt, n)
        if key not in self.greedy_cache:
            self.greedy_cache[key] = self.complete(
                prompt, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}
            )
        return self.greedy_cache[key]

    def greedy_chat(self, content, n):
        key = ("chat", content, n)
        if key not in self.greedy_cache:
            self.greedy_cache[key] = self.chat(
                content, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}
            )
        return self.greedy_cache[key]

    @staticmethod
    def check_usage(usage, what, completion=None):
        expect(usage is not None, f"{what}: no usage")
        expect(usage.prompt_tokens > 0, f"{what}: prompt_tokens {usage.prompt_tokens}")
        eq(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, f"{what}: total_tokens")
        if completion is not None:
            eq(usage.completion_tokens, completion, f"{what}: completion_tokens")

    @staticmethod
    def stop_string_in(text):
        """A two-character piece of `text` first seen at k >= 1 (past the middle when
        possible), and k: stopping on it must give text[:k]."""
        middle = max(1, len(text) // 2)
        for k in list(range(middle, len(text) - 1)) + list(range(1, middle)):
            s = text[k : k + 2]
            if s.strip() and "\ufffd" not in s and text.find(s) == k:
                return s, k
        raise CheckFailed(f"no usable stop string in {text!r}")

    def collect_stream(self, stream):
        """(texts by choice index, finish reasons by index, chunks, usage chunk)."""
        texts, finishes, chunks, usage = {}, {}, [], None
        for chunk in stream:
            chunks.append(chunk)
            if chunk.usage is not None:
                expect(usage is None, "two chunks carry usage")
                eq(chunk.choices, [], "usage chunk's choices")
                usage = chunk.usage
                continue
            for c in chunk.choices:
                piece = c.delta.content if hasattr(c, "delta") else c.text
                texts[c.index] = texts.get(c.index, "") + (piece or "")
                if c.finish_reason is not None:
                    expect(c.index not in finishes, f"choice {c.index} finished twice")
                    finishes[c.index] = c.finish_reason
        return texts, finishes, chunks, usage

    # Checks ---------------------------------------------------------------------------

    def models(self):
        ids = [m.id for m in self.client.models.list().data]
        expect(self.model in ids, f"{self.model!r} not in {ids}")
        return f"served: {ids}"

    def completion(self):
        prompt = self.p["cmpl"]
        r = self.greedy_completion(prompt, 12)
        eq(r.object, "text_completion", "object")
        eq(len(r.choices), 1, "choices")
        eq(r.choices[0].finish_reason, "length", "finish_reason")
        expect(r.choices[0].text, "empty text")
        self.check_usage(r.usage, "usage", completion=12)
        eq(r.usage.prompt_tokens, self.prompt_tokens(prompt), "prompt_tokens vs /tokenize")
        return f"{r.choices[0].text!r}, usage {r.usage.prompt_tokens}+{r.usage.completion_tokens}"

    def completion_greedy_twice(self):
        a = self.complete(self.p["cmpl2"], max_tokens=10, temperature=0).choices[0].text
        b = self.complete(self.p["cmpl2"], max_tokens=10, temperature=0).choices[0].text
        eq(b, a, "second greedy text")
        return f"{a!r} twice"

    def completion_stream(self):
        whole = self.greedy_completion(self.p["cmpl"], 12)
        stream = self.complete(
            self.p["cmpl"],
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        texts, finishes, chunks, usage = self.collect_stream(stream)
        eq(texts.get(0), whole.choices[0].text, "streamed text vs non-streamed")
        eq(finishes, {0: "length"}, "finish reasons")
        expect(usage is not None, "no usage chunk with include_usage")
        eq(chunks[-1].usage, usage, "usage is not the last chunk")
        eq(
            (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens),
            (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens),
            "streamed usage vs non-streamed",
        )
        for c in chunks[:-1]:
            expect(c.usage is None, f"a content chunk has usage {c.usage}")
            eq(c.object, "text_completion", "chunk object")
        return f"{len(chunks)} chunks, text and usage equal the non-streamed answer"

    def completion_stream_without_usage(self):
        stream = self.complete(self.p["short"], max_tokens=4, temperature=0, stream=True)
        _, finishes, chunks, usage = self.collect_stream(stream)
        expect(usage is None, "usage chunk without include_usage")
        expect(0 in finishes, "no finish_reason")
        return f"{len(chunks)} chunks, none with usage"

    def chat_completion(self):
        r = self.greedy_chat(self.p["chat"], 10)
        eq(r.object, "chat.completion", "object")
        m = r.choices[0].message
        eq(m.role, "assistant", "role")
        expect(isinstance(m.content, str) and m.content, f"content {m.content!r}")
        eq(r.choices[0].finish_reason, "length", "finish_reason")
        self.check_usage(r.usage, "usage", completion=10)
        return f"{m.content!r}, usage {r.usage.prompt_tokens}+{r.usage.completion_tokens}"

    def chat_stream(self):
        whole = self.greedy_chat(self.p["chat"], 10)
        stream = self.chat(
            self.p["chat"],
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        texts, finishes, chunks, usage = self.collect_stream(stream)
        eq(chunks[0].choices[0].delta.role, "assistant", "first delta's role")
        for c in chunks[1:]:
            for ch in c.choices:
                expect(ch.delta.role is None, "role repeated after the first chunk")
            eq(c.object, "chat.completion.chunk", "chunk object")
        eq(texts.get(0), whole.choices[0].message.content, "streamed content vs non-streamed")
        eq(finishes, {0: "length"}, "finish reasons")
        expect(usage is not None, "no usage chunk")
        eq(
            (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens),
            (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens),
            "streamed usage vs non-streamed",
        )
        return f"{len(chunks)} chunks, content and usage equal the non-streamed answer"

    def completion_stop(self):
        full = self.greedy_completion(self.p["stop_cmpl"], 24).choices[0].text
        s, k = self.stop_string_in(full)
        for stop in (s, ["<never-generated>", s]):
            r = self.complete(
                self.p["stop_cmpl"], max_tokens=24, temperature=0, stop=stop,
                extra_body={"ignore_eos": True},
            )
            eq(r.choices[0].text, full[:k], f"text with stop={stop!r}")
            eq(r.choices[0].finish_reason, "stop", f"finish_reason with stop={stop!r}")
            self.check_usage(r.usage, "usage")
            expect(r.usage.completion_tokens < 24, f"completion_tokens {r.usage.completion_tokens}")
        return f"stop {s!r} (string and list) ends {full!r} at {k}"

    def chat_stop(self):
        full = self.greedy_chat(self.p["stop_chat"], 24).choices[0].message.content
        s, k = self.stop_string_in(full)
        r = self.chat(self.p["stop_chat"], max_tokens=24, temperature=0, stop=[s], extra_body={"ignore_eos": True})
        eq(r.choices[0].message.content, full[:k], "content with stop")
        eq(r.choices[0].finish_reason, "stop", "finish_reason")
        stream = self.chat(
            self.p["stop_chat"], max_tokens=24, temperature=0, stop=s, stream=True, extra_body={"ignore_eos": True}
        )
        texts, finishes, _, _ = self.collect_stream(stream)
        eq(texts.get(0), full[:k], "streamed content with stop")
        eq(finishes, {0: "stop"}, "streamed finish reasons")
        return f"stop {s!r} ends the chat answer at {k}, streamed or not"

    def max_tokens_length(self):
        r = self.chat(self.p["short"], max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
        eq(r.choices[0].finish_reason, "length", "chat finish_reason")
        eq(r.usage.completion_tokens, 3, "chat completion_tokens")
        r = self.chat(self.p["short"], max_completion_tokens=2, temperature=0, extra_body={"ignore_eos": True})
        eq(r.usage.completion_tokens, 2, "completion_tokens with max_completion_tokens")
        r = self.complete(self.p["short"], max_tokens=1, temperature=0, extra_body={"ignore_eos": True})
        eq(r.choices[0].finish_reason, "length", "completion finish_reason")
        eq(r.usage.completion_tokens, 1, "completion completion_tokens")
        return "max_tokens 3 and 1, max_completion_tokens 2: finish_reason length"

    def chat_logprobs(self):
        r = self.chat(
            self.p["chat"], max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
            extra_body={"ignore_eos": True},
        )
        c = r.choices[0]
        content = c.logprobs.content
        eq(len(content), r.usage.completion_tokens, "logprobs entries vs completion_tokens")
        joined = b""
        for i, e in enumerate(content):
            expect(isinstance(e.token, str), f"[{i}].token {e.token!r}")
            expect(e.logprob <= 0.0, f"[{i}].logprob {e.logprob}")
            expect(isinstance(e.bytes, list), f"[{i}].bytes {e.bytes!r}")
            joined += bytes(e.bytes)
            eq(len(e.top_logprobs), 3, f"[{i}] top_logprobs")
            tops = [t.logprob for t in e.top_logprobs]
            expect(tops == sorted(tops, reverse=True), f"[{i}] top_logprobs not sorted: {tops}")
            # Greedy: the chosen token is the most likely one.
            eq(e.top_logprobs[0].token, e.token, f"[{i}] greedy token vs top 1")
            expect(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, f"[{i}] logprob vs top 1")
        eq(joined.decode("utf-8", "replace"), c.message.content, "tokens' bytes vs content")
        plain = self.chat(self.p["chat"], max_tokens=4, temperature=0, logprobs=True)
        for e in plain.choices[0].logprobs.content:
            eq(e.top_logprobs, [], "top_logprobs without top_logprobs")
        none = self.chat(self.p["chat"], max_tokens=2, temperature=0)
        expect(none.choices[0].logprobs is None, "logprobs present without logprobs")
        stream = self.chat(
            self.p["chat"], max_tokens=8, temperature=0, logprobs=True, top_logprobs=3, stream=True,
            extra_body={"ignore_eos": True},
        )
        streamed = []
        for chunk in stream:
            for ch in chunk.choices:
                if ch.logprobs is not None and ch.logprobs.content:
                    streamed.extend((e.token, round(e.logprob, 5)) for e in ch.logprobs.content)
        eq(streamed, [(e.token, round(e.logprob, 5)) for e in content], "streamed logprobs")
        return f"{len(content)} entries x 3 alternatives, streamed equal, bytes rebuild the content"

    def completion_logprobs(self):
        r = self.complete(
            self.p["cmpl"], max_tokens=8, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
        )
        c = r.choices[0]
        lp = c.logprobs
        n = r.usage.completion_tokens
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            eq(len(getattr(lp, name)), n, f"len(logprobs.{name})")
        ids = c.logprobs.model_extra["token_ids"]
        eq(len(ids), n, "len(logprobs.token_ids)")
        eq(lp.text_offset[0], 0, "text_offset[0]")
        expect(lp.text_offset == sorted(lp.text_offset), f"text_offset {lp.text_offset}")
        note = ""
        if "".join(lp.tokens) == c.text:
            starts = [sum(len(t.encode()) for t in lp.tokens[:i]) for i in range(n)]
            eq(lp.text_offset, starts, "text_offset vs the tokens' lengths")
        else:
            # A control token (its name is not in the text) or a lone UTF-8 byte.
            note = f" (tokens {lp.tokens} do not spell the text {c.text!r})"
        for i in range(n):
            top = lp.top_logprobs[i]
            expect(1 <= len(top) <= 2, f"top_logprobs[{i}] {top}")
            expect(lp.token_logprobs[i] <= 0.0, f"token_logprobs[{i}]")
            expect(abs(max(top.values()) - lp.token_logprobs[i]) < 1e-6, f"[{i}] greedy vs top")
        return f"{n} tokens, offsets {lp.text_offset}{note}"

    def seed_reproducible(self):
        kw = dict(max_tokens=16, temperature=0.8, extra_body={"ignore_eos": True})
        a = self.complete(self.p["seed"], seed=1234, **kw).choices[0].text
        b = self.complete(self.p["seed"], seed=1234, **kw).choices[0].text
        eq(b, a, "same seed, temperature 0.8")
        c = self.complete(self.p["seed"], seed=1235, **kw).choices[0].text
        expect(c != a, f"seeds 1234 and 1235 gave the same text {a!r}")
        ca = self.chat(self.p["seed"], seed=99, **kw).choices[0].message.content
        cb = self.chat(self.p["seed"], seed=99, **kw).choices[0].message.content
        eq(cb, ca, "chat, same seed")
        return f"seed 1234 twice {a!r}; seed 1235 {c!r}"

    def n_choices(self):
        kw = dict(max_tokens=8, temperature=0.8, extra_body={"ignore_eos": True})
        r = self.complete(self.p["n"], n=2, seed=7, **kw)
        eq(sorted(c.index for c in r.choices), [0, 1], "choice indices")
        eq(r.usage.completion_tokens, 16, "completion_tokens of n=2")
        self.check_usage(r.usage, "usage")
        eq(r.usage.prompt_tokens, self.prompt_tokens(self.p["n"]), "prompt counted once")
        by_index = {c.index: c.text for c in r.choices}
        # Choice i samples with seed + i.
        eq(by_index[0], self.complete(self.p["n"], seed=7, **kw).choices[0].text, "choice 0 vs seed 7")
        eq(by_index[1], self.complete(self.p["n"], seed=8, **kw).choices[0].text, "choice 1 vs seed 8")
        stream = self.chat(self.p["n"], n=2, seed=7, stream=True, stream_options={"include_usage": True}, **kw)
        texts, finishes, _, usage = self.collect_stream(stream)
        whole = self.chat(self.p["n"], n=2, seed=7, **kw)
        eq(texts, {c.index: c.message.content for c in whole.choices}, "streamed n=2 vs non-streamed")
        eq(finishes, {0: "length", 1: "length"}, "finish reasons")
        eq(usage.completion_tokens, 16, "streamed completion_tokens")
        return f"choices {by_index}"

    def logit_bias(self):
        kw = dict(max_tokens=6, temperature=0, logprobs=1, extra_body={"ignore_eos": True})
        plain = self.complete(self.p["cmpl"], **kw).choices[0]
        first = plain.logprobs.model_extra["token_ids"][0]
        bias = {str(first): -100}
        banned = self.complete(self.p["cmpl"], logit_bias=bias, **kw).choices[0]
        ids = banned.logprobs.model_extra["token_ids"]
        expect(first not in ids, f"token {first} was banned, yet generated: {ids}")
        again = self.complete(self.p["cmpl"], logit_bias=bias, **kw).choices[0]
        eq(again.text, banned.text, "the same biased request twice")
        stream = self.complete(self.p["cmpl"], logit_bias=bias, stream=True, **kw)
        texts, _, _, _ = self.collect_stream(stream)
        eq(texts[0], banned.text, "streamed vs not, with a logit bias")
        bad = openai.BadRequestError
        self.error(bad, 400, lambda: self.complete("x", logit_bias={"x": 1}), param="logit_bias")
        self.error(bad, 400, lambda: self.chat("x", logit_bias={"1": 101}), param="logit_bias")
        return f"token {first} banned: {plain.text!r} -> {banned.text!r}"

    def json_object(self):
        fmt = {"type": "json_object"}
        prompt = self.p.get("json")
        if prompt is None:
            # The tiny vocabulary has no "{": the request fails and says why.
            try:
                self.chat("x", max_tokens=4, response_format=fmt)
            except openai.APIError as e:
                expect("JSON mode" in str(e), f"error {e} does not mention JSON mode")
                return f"no '{{' in the vocabulary: {type(e).__name__}, {e.message!r}"
            raise CheckFailed("a vocabulary without '{' gave a JSON-mode answer")
        r = self.chat(prompt, max_tokens=120, temperature=0, response_format=fmt)
        c = r.choices[0]
        text = c.message.content
        expect(text.startswith("{"), f"JSON-mode answer {text!r}")
        if c.finish_reason == "stop":
            expect(isinstance(json.loads(text), dict), f"not an object: {text!r}")
        stream = self.chat(prompt, max_tokens=120, temperature=0, response_format=fmt, stream=True)
        texts, _, _, _ = self.collect_stream(stream)
        eq(texts[0], text, "streamed vs not, JSON mode")
        schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
        bad = openai.BadRequestError
        self.error(bad, 400, lambda: self.chat("x", response_format=schema), param="response_format")
        return f"{c.finish_reason}: {text[:60]!r}"

    def error(self, exc_type, status, call, **want):
        try:
            call()
        except exc_type as e:
            eq(e.status_code, status, f"{exc_type.__name__} status")
            for k, v in want.items():
                if k == "mentions":
                    expect(v in e.message, f"message {e.message!r} does not mention {v!r}")
                else:
                    eq(getattr(e, k), v, f"error {k} ({e.message!r})")
            return e
        except openai.APIError as e:
            raise CheckFailed(f"expected {exc_type.__name__}, got {type(e).__name__}: {e}")
        raise CheckFailed(f"expected {exc_type.__name__}, the call succeeded")

    def errors_bad_fields(self):
        bad = openai.BadRequestError
        self.error(bad, 400, lambda: self.chat("x", temperature="hot"), param="temperature", mentions="temperature")
        self.error(bad, 400, lambda: self.complete("x", max_tokens="many"), param="max_tokens", mentions="max_tokens")
        self.error(bad, 400, lambda: self.chat("x", logprobs=True, top_logprobs=99), param="top_logprobs")
        self.error(bad, 400, lambda: self.complete("x", n=0), param="n")
        self.error(
            bad, 400,
            lambda: self.client.chat.completions.create(model=self.model, messages=[{"content": "x"}]),
            param="messages[0].role",
        )
        self.error(bad, 400, lambda: self.complete("x", stop=[""]), param="stop")
        self.error(bad, 400, lambda: self.chat("x", temperature=-1, stream=True), param="temperature")
        return "temperature, max_tokens, top_logprobs, n, messages[0].role, stop (also streamed)"

    def errors_unknown_model(self):
        for call in (
            lambda: self.client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "x"}]
            ),
            lambda: self.client.completions.create(model="no-such-model", prompt="x", stream=True),
        ):
            self.error(openai.NotFoundError, 404, call, code="model_not_found", param="model")
        return "404 model_not_found, streamed or not"

    def errors_context(self):
        bad = openai.BadRequestError
        e = self.error(bad, 400, lambda: self.complete(LONG_PROMPT, max_tokens=4), code="context_length_exceeded")
        self.error(
            bad, 400, lambda: self.chat(LONG_PROMPT, max_tokens=4, stream=True), code="context_length_exceeded"
        )
        self.error(
            bad, 400, lambda: self.complete("x", max_tokens=10**9),
            code="context_length_exceeded", param="max_tokens",
        )
        return f"400 context_length_exceeded: {e.message}"

    def after_errors_still_serving(self):
        r = self.greedy_completion(self.p["cmpl"], 12)
        again = self.complete(self.p["cmpl"], max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
        eq(again.choices[0].text, r.choices[0].text, "greedy text after the errors")
        return "the same greedy answer as before"


ALL = [
    "models",
    "completion",
    "completion_greedy_twice",
    "completion_stream",
    "completion_stream_without_usage",
    "chat_completion",
    "chat_stream",
    "completion_stop",
    "chat_stop",
    "max_tokens_length",
    "chat_logprobs",
    "completion_logprobs",
    "seed_reproducible",
    "n_choices",
    "logit_bias",
    "json_object",
    "errors_bad_fields",
    "errors_unknown_model",
    "errors_context",
    "after_errors_still_serving",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--real", action="store_true")
    args = ap.parse_args()
    checks = Checks(args.base_url, args.model, PROMPTS["real" if args.real else "tiny"])
    print(f"openai {openai.__version__} against {args.base_url} (model {args.model})", flush=True)
    started = time.monotonic()
    for name in ALL:
        t = time.monotonic()
        try:
            detail = getattr(checks, name)()
        except CheckFailed as e:
            print(f"FAIL {name}: {e}", flush=True)
            return 1
        except Exception as e:  # an unexpected exception is a failure of its check too
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            return 1
        print(f"ok   {name} ({time.monotonic() - t:.2f} s): {detail}", flush=True)
    print(f"all {len(ALL)} checks passed in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
