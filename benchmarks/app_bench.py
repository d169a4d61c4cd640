"""Benchmark of the app (not a test): one comparison of base + 4 fine-tuned models at 10 steps, and 20 concurrent
requests to the launched app through gradio_client.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/app_bench.py [--threads 1] [--reps 5] [--concurrent 20]

Targets (issue 8): a comparison answers in under 2 s on 2 CPU cores; all 20 concurrent requests are answered.
The fine-tuned models are `app.fake_runs` (random LoRA checkpoints of the smoke shape): the cost does not depend
on the weights' values."""
import argparse, json, os, socket, statistics, tempfile, time
from pathlib import Path
os.environ.setdefault('GRADIO_ANALYTICS_ENABLED', 'False')
import torch
from flowgrpo_nb.app import ModelBank, fake_runs, generate_all, make_app

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--threads', type=int, default=1)  # 2 threads on busy shared cores: 20-50x slower
    ap.add_argument('--reps', type=int, default=5)
    ap.add_argument('--concurrent', type=int, default=20)
    ap.add_argument('--steps', type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    bank = ModelBank(fake_runs(tmp/'compare', methods=('flow_grpo', 'stepwise', 'dense', 'turning_point')))
    load_s = time.perf_counter() - t0
    prompts = ['a red circle', 'three squares', 'a cross left of a circle', 'a blue square and a yellow triangle']
    generate_all(bank, prompts[0], steps=a.steps)  # warm-up
    times = []
    for i in range(a.reps):
        t = time.perf_counter(); out = generate_all(bank, prompts[i % len(prompts)], seed=i, steps=a.steps)
        times.append(time.perf_counter() - t)
    assert len(out) == 5
    app = make_app(bank=bank)
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]
    app.queue(default_concurrency_limit=1).launch(server_name='127.0.0.1', server_port=port, prevent_thread_lock=True, quiet=True)
    from gradio_client import Client
    c = Client(f'http://127.0.0.1:{port}/', verbose=False)
    t = time.perf_counter()
    jobs = [c.submit(prompts[i % len(prompts)], i, a.steps, 4.0, 'ode', api_name='/generate') for i in range(a.concurrent)]
    answered, lat = 0, []
    for j in jobs:
        r = j.result(timeout=1800)
        answered += len(r[1]) == 5
        lat.append(time.perf_counter() - t)
    conc_s = time.perf_counter() - t
    app.close()
    print(json.dumps(dict(threads=a.threads, models=len(bank.names), steps=a.steps, load_s=round(load_s, 2),
                          comparison_s=dict(median=round(statistics.median(times), 3), min=round(min(times), 3),
                                            all=[round(x, 3) for x in times]),
                          concurrent=dict(requests=a.concurrent, answered=answered, wall_s=round(conc_s, 1),
                                          last_answer_s=round(max(lat), 1)),
                          target_met=statistics.median(times) < 2 and answered == a.concurrent), indent=1))

if __name__ == '__main__': main()
