"""The evaluation's own noise: the shipped base model evaluated under R noise seeds, and what each SE estimate says.

Why (issue 50, item 2). A run logs `eval_overall_se`, the prompt-clustered SE of one evaluation (about 0.03 at 1,200
images), while the base model evaluated under 14 noise seeds (results/confirm's base evaluations) spreads with an SD of
about 0.011. This script measures the spread again, at several evaluation sizes, and sets the estimates of
`flowgrpo_nb.study.stats` beside it: the binomial SE of the overall score from per-prompt results (within-prompt
binomial variance plus the between-prompt spread, `eval_se`) and the prompt-clustered SE the trainer logs.

The design: the base model (world and model of the shipped version) evaluated as a run of the confirmatory budget
evaluates it (`CompareConfig(budget='confirm')`: 1,200 images, K = 10 Euler ODE steps, shift 1, guidance 4, fp32
eager, one thread), under the noise seeds of R = 8 training seeds (`seed + EVAL_SEED`; seeds 9000.. are used by no
study). Each evaluation's images are drawn independently (the prompts within a category and the initial noise), so
its first and second 600 images are two independent evaluations of 600, and so on: an evaluation of `s` images is
every disjoint block of `s` of the R evaluations (s a multiple of the 6 categories, each block balanced as
`evaluate_policy` balances it). Per draw the JSON keeps the per-image strict scores (a string of 0 and 1 in evaluation
order: the prompts are `balanced_prompts` of the seed, checked by a hash), so every number is recomputed from it.

    python benchmarks/eval_noise.py            # evaluates the draws not yet in the file, then writes the analysis
    python benchmarks/eval_noise.py --analyse  # only the analysis, from the draws in the file
"""
import argparse, hashlib, json, math, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT/'results'/'eval_noise'/'eval_noise.json'
SEEDS = tuple(range(9000, 9008))      # R = 8 training seeds; their evaluation noise is seed + EVAL_SEED
SIZES = (240, 480, 600, 1200)         # evaluation sizes measured by disjoint blocks of each draw

def settings():
    "(the run config of a training seed of the confirmatory budget, the task it is evaluated on)."
    from flowgrpo_nb.study.design import CompareConfig
    from flowgrpo_nb.task import load_task
    ccfg = CompareConfig(budget='confirm')
    cfg = lambda s: ccfg.train_config('flow_grpo', s, 'geneval')
    return cfg, load_task(cfg(SEEDS[0]).reward)

def names_hash(names:list) -> str: return hashlib.sha1('\n'.join(names).encode()).hexdigest()[:16]

def draw(policy, task, cfg) -> dict:
    "One evaluation of `policy` under the noise of `cfg`: its logged numbers and the per-image strict scores."
    from flowgrpo_nb.task import evaluate_policy
    from flowgrpo_nb.train import eval_settings
    from flowgrpo_nb.world import mini_geneval
    from flowgrpo_nb.precision import resolve_fast
    ev, c0, t0 = eval_settings(cfg), time.process_time(), time.perf_counter()
    fast = resolve_fast(cfg.fast, cfg.model)[0]
    rep, images, names = evaluate_policy(policy.set_fast(fast), task, **ev, return_images=True)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    strict = mini_geneval(images, names).strict
    return dict(seed=cfg.seed, eval_seed=ev['seed'], n_images=ev['n_images'], cpu_seconds=round(cpu, 2),
                wall_seconds=round(wall, 2), overall=rep.overall, overall_se=rep.overall_se,
                names=names_hash(names), strict=''.join(str(int(x)) for x in strict.tolist()))

def evaluate_missing(data:dict) -> dict:
    "Evaluate the seeds of `SEEDS` not yet in `data`, writing the file after each."
    import torch
    from flowgrpo_nb.task import load_policy
    from flowgrpo_nb.study.compare import machine
    from flowgrpo_nb.train import eval_settings
    torch.set_num_threads(1)
    cfg, task = settings()
    c0 = cfg(SEEDS[0])
    policy = load_policy(**c0.backend())
    data.setdefault('machine', machine() | dict(threads=torch.get_num_threads()))
    ev = {k: v for k, v in eval_settings(c0).items() if k != 'seed'}
    data.setdefault('settings', dict(budget='confirm', task=task.name, **ev, fast=c0.fast,
                                     base=policy.base_fingerprint()))
    done = {d['seed'] for d in data.setdefault('draws', [])}
    for s in SEEDS:
        if s in done: continue
        d = draw(policy, task, cfg(s))
        data['draws'].append(d)
        print(f"seed {s}: overall {d['overall']:.4f} (logged SE {d['overall_se']:.4f}), {d['cpu_seconds']:.0f} CPU s",
              flush=True)
        write(data)
    return data

def blocks(draws:list, task, size:int):
    """Every disjoint block of `size` images of every draw: (overall, per-prompt results over the task's prompts,
    per-image strict, prompts)."""
    import torch
    from flowgrpo_nb.task import balanced_prompts, reward_report
    for d in draws:
        names = balanced_prompts(task.eval_prompts, d['n_images'], d['eval_seed'], task.category)
        if names_hash(names) != d['names']:
            raise ValueError(f"seed {d['seed']}: the prompts drawn today are not those evaluated (the world changed)")
        strict = torch.tensor([float(c) for c in d['strict']])
        for j in range(d['n_images'] // size):
            i = slice(j * size, (j + 1) * size)
            rep = reward_report(strict[i], names[i], task.category)
            yield rep.overall, rep.prompts.over(task.eval_prompts)

def analyse(data:dict) -> dict:
    "Per evaluation size: the redraws' SD (95% CI) and the mean of each SE estimate over the same evaluations."
    import numpy as np
    from scipy import stats
    from flowgrpo_nb.study.stats import eval_se
    _, task = settings()
    cats = [task.category(p) for p in task.eval_prompts]
    out = {}
    for size in SIZES:
        rows = [(o, eval_se(p.n, p.mean, cats)) for o, p in blocks(data['draws'], task, size)]
        o = np.array([r[0] for r in rows])
        k, sd = len(o), float(o.std(ddof=1))
        lo, hi = (sd * math.sqrt((k - 1) / stats.chi2.ppf(q, k - 1)) for q in (0.975, 0.025))
        assert all(abs(e['overall'] - x) < 1e-12 for x, e in rows)  # eval_se's overall is the evaluation's
        out[str(size)] = dict(
            evaluations=k, mean=float(o.mean()), redraw_sd=sd, redraw_sd_ci=[lo, hi],
            binomial_se=float(np.mean([e['se'] for _, e in rows])),
            # the root of the mean variance of each part: the two add up to about binomial_se squared
            within_se=math.sqrt(np.mean([e['within'] for _, e in rows])),
            between_se=math.sqrt(np.mean([e['between'] for _, e in rows])),
            clustered_se=float(np.mean([e['clustered'] for _, e in rows])),
            clustered_se_range=[min(e['clustered'] for _, e in rows), max(e['clustered'] for _, e in rows)])
    return out

def committed_base() -> dict|None:
    "results/confirm's 14 base evaluations (1,200 images, other seeds): their SD and the mean of the logged SE."
    import numpy as np
    from scipy import stats
    files = sorted((ROOT/'results'/'confirm'/'runs'/'base').glob('*/seed*.json'))
    if not files: return None
    ds = [json.loads(f.read_text()) for f in files]
    o = np.array([d['overall'] for d in ds])
    k, sd = len(o), float(o.std(ddof=1))
    ci = [sd * math.sqrt((k - 1) / stats.chi2.ppf(q, k - 1)) for q in (0.975, 0.025)]
    # the binomial SE from the category means alone: p(1-p)/(N-1) per category (within plus between prompts)
    binom = [math.sqrt(sum(c['score'] * (1 - c['score']) / (c['n'] - 1) for c in d['categories'].values()))
             / len(d['categories']) for d in ds]
    return dict(source='results/confirm/runs/base', evaluations=k, n_images=ds[0]['n'], redraw_sd=sd, redraw_sd_ci=ci,
                clustered_se=float(np.mean([d['overall_se'] for d in ds])), binomial_se=float(np.mean(binom)))

def write(data:dict):
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + '\n')

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--analyse', action='store_true', help='only the analysis, from the draws already in the file')
    a = ap.parse_args(argv)
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    if not a.analyse: data = evaluate_missing(data)
    data['sizes'], data['committed_base'] = analyse(data), committed_base()
    write(data)
    for s, r in data['sizes'].items():
        print(f"{s:>5} images, {r['evaluations']:>2} evaluations: redraw SD {r['redraw_sd']:.4f} "
              f"[{r['redraw_sd_ci'][0]:.4f}, {r['redraw_sd_ci'][1]:.4f}]; binomial SE {r['binomial_se']:.4f}, "
              f"clustered SE {r['clustered_se']:.4f}")

if __name__ == '__main__': main()
