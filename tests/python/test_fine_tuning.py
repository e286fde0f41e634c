#!/usr/bin/env python3
"""Blink's fine-tuning jobs against the official `openai` Python client.

Usage: test_fine_tuning.py --base-url http://127.0.0.1:PORT/v1 --api-key KEY --data FILE

The server must run with `--state-dir` and `--api-key KEY`; FILE is a small chat
fine-tuning JSONL (a few examples: the job trains one epoch, one example per step).
Checks files.create, fine_tuning.jobs create/retrieve/list/list_events/pause/resume/
cancel and jobs.checkpoints.list, a chat on the finished `ft:` model, and that an unknown
file, an unknown job and a move the job's state forbids get their 4xx. A missing `openai`
package is a failure, not a skip.
"""

import argparse
import time

from checks import require_openai, run_checks  # beside this script

openai = require_openai()
OpenAI = openai.OpenAI

CHECKS = []

# How long a job may show no change at all (status, events) before it is called stuck.
STUCK_SECONDS = 120


def check(fn):
    CHECKS.append(fn)
    return fn


class Ctx:
    def __init__(self, args):
        self.client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
        with open(args.data, "rb") as f:
            self.data = f.read()
        self.base = self.client.models.list().data[0].id
        self.file = None
        self.job = None

    def status_of(self, fn):
        """The HTTP status `fn` failed with (it must fail)."""
        try:
            fn()
        except openai.APIStatusError as e:
            return e.status_code
        raise AssertionError("the call succeeded")

    def wait(self, job_id, done):
        """The job once `done(job)` holds; fails when it shows no change for STUCK_SECONDS."""
        last, since = None, time.monotonic()
        while True:
            job = self.client.fine_tuning.jobs.retrieve(job_id)
            if done(job):
                return job
            n_events = len(list(self.client.fine_tuning.jobs.list_events(job_id, limit=100)))
            now = (job.status, n_events)
            if now != last:
                last, since = now, time.monotonic()
            assert time.monotonic() - since < STUCK_SECONDS, f"job {job_id} is stuck: {job}"
            time.sleep(0.1)


def hyperparameters(n_epochs=1):
    return {"type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": n_epochs, "batch_size": 1, "learning_rate_multiplier": 10}}}


@check
def a_file_and_a_job_are_created(c):
    c.file = c.client.files.create(file=("train.jsonl", c.data), purpose="fine-tune")
    job = c.client.fine_tuning.jobs.create(model=c.base, training_file=c.file.id, method=hyperparameters(), suffix="py", seed=3)
    assert job.id.startswith("ftjob-") and job.object == "fine_tuning.job", job
    assert (job.model, job.training_file, job.seed, job.user_provided_suffix) == (c.base, c.file.id, 3, "py"), job
    assert job.method.type == "supervised" and job.method.supervised.hyperparameters.n_epochs == 1, job
    assert job.status in ("validating_files", "queued", "running"), job
    c.job = job
    assert c.client.fine_tuning.jobs.retrieve(job.id).id == job.id
    assert job.id in [j.id for j in c.client.fine_tuning.jobs.list(limit=10)]


@check
def a_running_job_pauses_and_resumes(c):
    c.wait(c.job.id, lambda j: j.status == "running")
    paused = c.client.fine_tuning.jobs.pause(c.job.id)
    assert paused.status == "paused", paused
    assert c.status_of(lambda: c.client.fine_tuning.jobs.pause(c.job.id)) == 409
    resumed = c.client.fine_tuning.jobs.resume(c.job.id)
    assert resumed.status in ("queued", "running"), resumed


@check
def another_job_is_cancelled(c):
    other = c.client.fine_tuning.jobs.create(model=c.base, training_file=c.file.id, hyperparameters={"n_epochs": 3})
    cancelled = c.client.fine_tuning.jobs.cancel(other.id)
    assert cancelled.status == "cancelled" and cancelled.fine_tuned_model is None, cancelled
    assert c.status_of(lambda: c.client.fine_tuning.jobs.resume(other.id)) == 409
    first = c.client.fine_tuning.jobs.list(limit=1)
    assert [j.id for j in first.data] == [other.id] and first.has_more, first
    assert [j.id for j in c.client.fine_tuning.jobs.list(limit=5, after=other.id)] == [c.job.id]


@check
def the_job_succeeds_with_its_events_and_checkpoint(c):
    job = c.wait(c.job.id, lambda j: j.status in ("succeeded", "failed", "cancelled"))
    assert job.status == "succeeded", job
    assert job.fine_tuned_model == f"ft:{c.base}:py:{job.id}", job
    assert job.trained_tokens > 0 and job.finished_at, job
    events = list(c.client.fine_tuning.jobs.list_events(job.id, limit=3))  # walks the pages
    steps = [e.data["step"] for e in reversed(events) if e.type == "metrics"]
    examples = c.data.count(b"\n")
    assert steps == list(range(1, examples + 1)), steps
    messages = [e.message for e in events]
    assert "Fine-tuning job paused" in messages and "Fine-tuning job resumed" in messages, messages
    page = c.client.fine_tuning.jobs.list_events(job.id, limit=2)
    assert len(page.data) == 2 and page.has_more, page
    checkpoints = c.client.fine_tuning.jobs.checkpoints.list(job.id)
    assert [k.step_number for k in checkpoints.data] == [examples], checkpoints
    k = checkpoints.data[0]
    assert k.fine_tuned_model_checkpoint == f"{job.fine_tuned_model}:ckpt-step-{examples}", k
    assert k.metrics.train_loss > 0, k
    c.job = job


@check
def the_fine_tuned_model_chats(c):
    model = c.job.fine_tuned_model
    assert model in [m.id for m in c.client.models.list()]
    r = c.client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Can you name the largest lake in Zorbania?"}],
                                         max_tokens=16, temperature=0)
    assert r.model == model and r.choices[0].message.content, r


@check
def bad_requests_are_4xx(c):
    jobs = c.client.fine_tuning.jobs
    assert c.status_of(lambda: jobs.create(model=c.base, training_file="file-nope")) == 400
    assert c.status_of(lambda: jobs.create(model="no-such-model", training_file=c.file.id)) == 400
    assert c.status_of(lambda: jobs.create(model=c.base, training_file=c.file.id, method={"type": "dpo", "dpo": {}})) == 400
    assert c.status_of(lambda: jobs.create(model=c.base, training_file=c.file.id, hyperparameters={"n_epochs": 0})) == 400
    assert c.status_of(lambda: jobs.retrieve("ftjob-nope")) == 404
    assert c.status_of(lambda: jobs.checkpoints.list("ftjob-nope")) == 404
    assert c.status_of(lambda: jobs.pause(c.job.id)) == 409
    assert c.status_of(lambda: jobs.cancel(c.job.id)) == 409


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--data", required=True)
    args = ap.parse_args()
    run_checks(CHECKS, Ctx(args), "test_fine_tuning.py")


if __name__ == "__main__":
    main()
