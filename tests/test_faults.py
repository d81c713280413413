"""Crash at any moment: kill a real kernel, rerun to completion, check the invariants.

Each kill runs the fault notebook (cell steps, a sub-step loop, async
sub-steps, a large variable, a mail sent through a provider that
deduplicates on idempotency keys, and a step that writes files, one whole
and one appended to, which the last cell reads) until the kernel dies, then
reruns it in fresh kernels until it completes, then once more. Kills come
from inside (``os._exit`` at a named point, see ``nbdurable.faults``, or
inside a model call) and from outside (SIGKILL after a random delay); one
kind deletes the step's output files after a complete run and kills the
rerun while it hashes the files written anew. After every kill:

- the store opens and passes an integrity check (orphan files from an
  interrupted write are cleaned, and a second check is clean);
- every sub-step recorded before the kill is replayed, never executed again;
- the provider delivered the notification exactly once;
- the final variables and outputs are those of the recorded values: a
  further full rerun makes no call and prints the same digest;
- the file the step wrote holds the recorded report, and that further rerun
  replays the step (its appended log does not grow).

CI runs a fixed set that hits every phase, seeded (the seed is printed;
``NBDURABLE_FAULT_SEED`` fixes it). The soak mode runs hundreds of random
kills: ``python tests/test_faults.py --soak 500 [--seed S]``; with
``--store postgresql://...`` the soak runs on the team store (the fixed set
runs on it in tests/test_postgres_kernels.py).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from kernel_util import make_notebook, run_notebook
from nbclient.exceptions import CellExecutionError, DeadKernelError

from nbdurable.demo.sim import MailProvider, ledger_calls
from nbdurable.store import open_store
from nbdurable.store.records import SubRecord

pytestmark = pytest.mark.kernel

N_QUESTIONS = 10
N_ASYNC = 4
N_WRITTEN = 2  # files the export step writes: out/report.txt, out/exports.log

CELLS = [
    "%load_ext nbdurable\n"
    "import os, json, hashlib, asyncio\n"
    "from pathlib import Path\n"
    "from nbdurable import step, idempotency_key\n"
    "from nbdurable.demo.sim import (\n"
    "    llm_plan, search_web, llm_answer, llm_synthesize, MailProvider\n"
    ")\n"
    "Path(os.environ['FAULT_PID_FILE']).write_text(str(os.getpid()))\n"
    "def append(path, text):\n"
    "    with open(path, 'a') as fh:\n"
    "        fh.write(text)\n"
    "topic = 'crash safety'",
    f'%%step plan\nplan = step("plan", llm_plan, topic, {N_QUESTIONS})\nprint(plan["title"])',
    "%%step research\n"
    "findings = []\n"
    'for i, q in enumerate(plan["subquestions"]):\n'
    '    docs = step(f"search:{i}", search_web, q)\n'
    '    findings.append(step(f"answer:{i}", llm_answer, q, docs))\n'
    "print(len(findings), 'findings')",
    "%%step parallel\n"
    "async def ask(q):\n"
    "    await asyncio.sleep(0.001)\n"
    "    return await asyncio.to_thread(llm_answer, q, [])\n"
    f"questions = [f'async {{k}}: {{topic}}?' for k in range({N_ASYNC})]\n"
    "answers = await asyncio.gather(*(step(f'async:{k}', ask, q) "
    "for k, q in enumerate(questions)))",
    "%%step big\n"
    "import numpy as np\n"
    "big = np.random.default_rng().random(2_000_000)\n"
    "print(big.shape)",
    "%%step report\nreport = step('synthesize', llm_synthesize, topic, findings + answers)\nreport",
    "%%step notify\n"
    "receipt = step('notify', lambda: MailProvider().send(\n"
    "    to='user@example.com', body=report[:80], idempotency_key=idempotency_key('notify')))\n"
    "print(receipt['id'])",
    "%%step export\n"
    "os.makedirs('out', exist_ok=True)\n"
    "Path('out/report.txt').write_text(report)\n"
    "append('out/exports.log', 'exported\\n')",
    "digest = {\n"
    "    'title': plan['title'],\n"
    "    'findings': [hashlib.sha256(f.encode()).hexdigest()[:12] for f in findings],\n"
    "    'answers': [hashlib.sha256(a.encode()).hexdigest()[:12] for a in answers],\n"
    "    'big': hashlib.sha256(big.tobytes()).hexdigest()[:12],\n"
    "    'report': hashlib.sha256(report.encode()).hexdigest()[:12],\n"
    "    'receipt': receipt['id'],\n"
    "    'export': hashlib.sha256(Path('out/report.txt').read_bytes()).hexdigest()[:12],\n"
    "}\n"
    "print('DIGEST ' + json.dumps(digest, sort_keys=True))",
]

#: Every phase the issue names, each a kill the suite must survive.
FIXED_KILLS = [
    ("sim", 4),  # inside a model call (the 4th answer)
    ("point", "sub-returned", 7),  # a call returned, its record not yet written
    ("point", "sub-written", 12),  # just after a sub-step's record
    ("point", "store-write", 9),  # inside a store transaction, before commit
    ("point", "blob-written", 4),  # a step's variables written, its record not yet
    ("point", "step-written", 3),  # just after a step's record
    ("replay", 3),  # in the middle of restoring variables on replay
    ("point", "file-hashed", 2),  # hashing the files a step wrote, its record not yet written
    ("gone", 1),  # output files deleted, then a kill while the rerun hashes them anew
    ("sigkill", None),  # SIGKILL from outside at a random moment
]


class Scenario:
    """One kill and the reruns after it, in its own directory."""

    def __init__(
        self, root: Path, kill: tuple, rng: random.Random, store_url: str | None = None
    ) -> None:
        self.root, self.kill, self.rng = root, kill, rng
        root.mkdir(parents=True, exist_ok=True)
        self.store_dir = root / "store"
        # The store under test: the directory, or a PostgreSQL URL (the team store).
        self.store = store_url or self.store_dir
        self.ledger = root / "ledger.jsonl"
        self.mailbox = root / "mailbox.sqlite"
        self.pid_file = root / "kernel.pid"
        self.env = {
            "NBDURABLE_DIR": str(self.store_dir),
            "NBDURABLE_NOTEBOOK": str(root / "faults.ipynb"),
            "NBDURABLE_SIM_LEDGER": str(self.ledger),
            "NBDURABLE_SIM_MAILBOX": str(self.mailbox),
            "NBDURABLE_SIM_LATENCY": "0.002",
            "FAULT_PID_FILE": str(self.pid_file),
        }
        if store_url:
            self.env["NBDURABLE_STORE"] = store_url

    def attempt(self, extra: dict[str, str] | None = None, sigkill_after: float | None = None):
        """Run the notebook once; return it, or None if the kernel died."""
        env = {**self.env, **(extra or {})}
        nb = make_notebook(CELLS)
        killer = None
        if sigkill_after is not None:
            self.pid_file.unlink(missing_ok=True)
            killer = threading.Thread(target=self._sigkill, args=(sigkill_after,), daemon=True)
            killer.start()
        try:
            return run_notebook(nb, cwd=self.root, env=env, timeout=120)
        except DeadKernelError:
            return None
        finally:
            if killer is not None:
                killer.join()

    def _sigkill(self, delay: float) -> None:
        deadline = time.monotonic() + 30
        while not self.pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        try:
            os.kill(int(self.pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass  # the run finished first: still a valid scenario

    def recorded_substeps(self) -> dict[str, tuple[str, str]]:
        """Sub-step records now in the store: key -> (ledger kind, ledger arg)."""
        out = {}
        with open_store(self.store) as store:
            for key in store.scan("r/"):
                if "/u/" not in key:
                    continue
                got = store.get(key)
                rec = SubRecord.from_header(got[0])
                out[key] = rec.id
        return out

    def check_store(self) -> None:
        with open_store(self.store) as store:
            store.check(fix=True)
            assert store.check(fix=False) == [], "a second integrity check must be clean"

    def run_to_completion(self, tries: int = 4):
        for _ in range(tries):
            try:
                nb = self.attempt()
            except CellExecutionError as exc:  # pragma: no cover - shows what went wrong
                raise AssertionError(f"{self.kill}: a rerun failed: {exc}") from exc
            if nb is not None:
                return nb
        raise AssertionError(f"{self.kill}: the notebook never completed after the kill")


def _digest(nb) -> dict:
    for out in nb.cells[-1].outputs:
        if out.get("output_type") == "stream" and "DIGEST " in out["text"]:
            return json.loads(out["text"].split("DIGEST ", 1)[1])
    raise AssertionError(f"no digest printed: {nb.cells[-1].outputs}")


def _exports(root: Path) -> int:
    """How many times the export step's body ran since its output directory was made."""
    return (root / "out" / "exports.log").read_text().count("exported")


def _calls(ledger: Path) -> Counter:
    return Counter((c["kind"], c["arg"]) for c in ledger_calls(ledger))


def _ledger_key(sub_id: str, ns: dict) -> tuple[str, str] | None:
    """The ledger entry a sub-step id makes, for the ids of the fault notebook."""
    kind, _, idx = sub_id.partition(":")
    if kind in ("search", "answer"):
        return kind, ns["questions"][int(idx)]
    if kind == "async":
        return "answer", f"async {idx}: crash safety?"
    if kind == "plan":
        return "plan", "crash safety"
    if kind == "synthesize":
        return "synthesize", "crash safety"
    return None


def run_scenario(root: Path, kill: tuple, rng: random.Random, store_url: str | None = None) -> str:
    """Kill, rerun to completion, check every invariant; return a one-line summary."""
    sc = Scenario(root, kill, rng, store_url)
    kind = kill[0]
    if kind == "sim":
        first = sc.attempt({"NBDURABLE_SIM_CRASH_AT": str(kill[1])})
    elif kind == "point":
        first = sc.attempt({"NBDURABLE_FAULT": f"{kill[1]}:{kill[2]}"})
    elif kind == "replay":
        assert sc.attempt() is not None
        first = sc.attempt({"NBDURABLE_FAULT": f"replay:{kill[1]}"})
    elif kind == "gone":
        assert sc.attempt() is not None
        shutil.rmtree(root / "out")  # `git clean`: the export step must write them again
        first = sc.attempt({"NBDURABLE_FAULT": f"file-hashed:{kill[1]}"})
    else:
        first = sc.attempt(sigkill_after=kill[1] if kill[1] is not None else rng.uniform(0, 2.5))
    died = first is None
    if kind in ("sim", "point", "replay", "gone"):
        assert died, f"{kill}: the kernel was supposed to die"

    sc.check_store()
    at_kill = _calls(sc.ledger)
    recorded = sc.recorded_substeps()

    final = sc.run_to_completion()
    sc.check_store()
    after = _calls(sc.ledger)

    questions = [
        f"Q{i + 1}: what does the evidence say about crash safety, angle {i + 1}?"
        for i in range(N_QUESTIONS)
    ]
    for key, sub_id in recorded.items():
        entry = _ledger_key(sub_id, {"questions": questions})
        if entry is None:
            continue
        assert after[entry] == at_kill[entry], (
            f"{kill}: sub-step {key} was recorded before the kill but ran again "
            f"({at_kill[entry]} -> {after[entry]} calls)"
        )
    assert MailProvider(sc.mailbox).delivered() == 1, f"{kill}: the mail went out twice"

    # The final values are the recorded ones: one more full run calls nothing
    # and prints the same digest.
    digest = _digest(final)
    assert digest["export"] == digest["report"], f"{kill}: the exported file is not the report"
    exports = _exports(root)
    again = sc.attempt()
    assert again is not None
    assert _calls(sc.ledger) == after, f"{kill}: a fully recorded run still made calls"
    assert _digest(again) == digest
    assert _exports(root) == exports, f"{kill}: the export step ran again with its files intact"
    # ...and each finding is the value its last (recorded) call returned.
    last_out = {}
    for c in ledger_calls(sc.ledger):
        last_out[(c["kind"], c["arg"])] = c["out"]
    assert digest["findings"] == [last_out[("answer", q)] for q in questions]
    return f"{kill}: kernel {'died' if died else 'finished first'}; invariants hold"


@pytest.fixture(scope="module")
def seed():
    value = int(os.environ.get("NBDURABLE_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"\nfault injection seed: {value} (rerun with NBDURABLE_FAULT_SEED={value})")
    return value


@pytest.mark.parametrize("kill", FIXED_KILLS, ids=lambda k: "-".join(map(str, k)))
def test_survives_a_kill(kill, tmp_path, seed):
    rng = random.Random(f"{seed}-{kill}")
    print(run_scenario(tmp_path / "run", kill, rng))


def random_kill(rng: random.Random) -> tuple:
    """A kill drawn at random from every phase."""
    points = ["sub-returned", "sub-written", "store-write", "blob-written", "step-written"]
    choice = rng.randrange(5)
    if choice == 0:
        return ("sim", rng.randint(1, N_QUESTIONS + N_ASYNC))
    if choice == 1:
        return ("point", rng.choice(points), rng.randint(1, 6))
    if choice == 2:
        return ("replay", rng.randint(1, 3))
    if choice == 3:  # the export step hashes N_WRITTEN files: a kill at one of them
        kind = rng.choice(["point", "gone"])
        n = rng.randint(1, N_WRITTEN)
        return ("point", "file-hashed", n) if kind == "point" else ("gone", n)
    return ("sigkill", rng.uniform(0, 3.0))


def soak(n: int, seed: int, root: Path, store_url: str | None = None) -> None:
    """Run ``n`` random kills; stop at the first broken invariant.

    With ``store_url`` (a PostgreSQL server), each kill records into a
    namespace of its own there, dropped once its invariants held.
    """
    rng = random.Random(seed)
    died = 0
    started = time.monotonic()
    for i in range(n):
        kill = random_kill(rng)
        url = None
        if store_url:
            url = f"{store_url}{'&' if '?' in store_url else '?'}namespace=soak_{seed}_{i}"
        try:
            line = run_scenario(root / f"kill{i}", kill, rng, url)
        except AssertionError as exc:
            raise SystemExit(f"kill #{i} {kill} (seed {seed}): {exc}") from exc
        if url:
            with open_store(url) as store:
                store.drop()
        died += "died" in line
        print(f"[{i + 1}/{n}] {line}", flush=True)
    print(
        f"soak: {n} kills ({died} killed the kernel, {n - died} finished first), "
        f"all invariants held, {time.monotonic() - started:.0f} s, seed {seed}"
    )


if __name__ == "__main__":
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="soak the fault-injection suite")
    parser.add_argument("--soak", type=int, default=100, help="number of random kills")
    parser.add_argument("--seed", type=int, default=None, help="seed (printed if not given)")
    parser.add_argument(
        "--store", default=None, help="a postgresql:// URL: soak the team store instead"
    )
    args = parser.parse_args()
    if args.store:
        os.environ.setdefault("NBDURABLE_KEY", "soak-" + "k" * 16)
    chosen = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"fault injection soak: {args.soak} kills, seed {chosen}", flush=True)
    with tempfile.TemporaryDirectory(prefix="nbdurable-soak-") as tmp:
        soak(args.soak, chosen, Path(tmp), args.store)
