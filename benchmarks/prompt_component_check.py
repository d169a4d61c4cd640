"""How conservative the post hoc prompt component is, where it can be checked: on `results/credit`, whose runs logged
per-prompt results, each claim's seeds-and-prompts interval by the two-way bootstrap (`stats.seeds_prompts_ci`, what
its report holds) beside the seed-only interval widened by one seed's prompt variance (`stats.prompt_variance`,
`stats.widened_ci`: what `results/confirm` gets from seed 2002's re-evaluated adapters), for each of its seeds in turn.

`python benchmarks/prompt_component_check.py` (about 20 s: the report is rebuilt from the kept runs, nothing trained)
prints per claim the half-widths: seed-only, two-way, and the one-seed widening's median [min, max] over seeds."""
import numpy as np
import flowgrpo_nb.study.compare as cm
from flowgrpo_nb.study.design import load_prereg, prereg_file, equal_compute, budget_of, CompareConfig
from flowgrpo_nb.study.summary import prompt_effects
from flowgrpo_nb.study.stats import prompt_variance, widened_ci

if __name__ == '__main__':
    kept, judge = {}, cm.judge
    def spy(tasks, *a, **k): kept['tasks'] = tasks; return judge(tasks, *a, **k)  # the sections, before JSON
    cm.judge = spy
    rep = cm.rebuild_report('results/credit/runs')
    ccfg = CompareConfig(**{**rep.config, 'fidelity': None})
    pre = load_prereg(prereg_file(ccfg.budget, ccfg.prereg))
    claims = [*pre.claims, *equal_compute(pre.claims, budget_of(ccfg.budget, ccfg.prereg).get('steps'))]
    names, strata = cm.heldout_prompts(rep.setup, 'geneval')
    byid, half = {c.id: c for c in rep.contrasts}, lambda ci: (ci[1] - ci[0]) / 2
    print('claim      seed-only  two-way  one seed widened: median [min, max] over seeds')
    for cl in claims:
        r = byid[cl.id]
        if r.ci_prompts is None: continue
        D, W = prompt_effects(kept['tasks'][cl.task], cl)
        w = [half(widened_ci(r.mean, r.ci, r.sd, r.n, prompt_variance(D[s], W[s], strata))) for s in range(len(D))]
        print(f"{cl.id:9s}  {half(r.ci):.4f}     {half(r.ci_prompts):.4f}   {np.median(w):.4f} [{min(w):.4f}, "
              f"{max(w):.4f}]")
