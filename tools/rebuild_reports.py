"""Rebuild the committed reports from their kept runs with the code of this checkout, without training anything.

`results/study`, `results/confirm` and `results/credit` keep their runs' small files in `runs/` (tools/keep_runs.py):
each report is rebuilt from them (`study.compare.rebuild_report`, with the fidelity file the report drew);
`results/compare` and `results/main` kept no run folders, so each is judged again from its own run records
(`study.compare.report_from_records`). What the report records of how the runs ran (`setup`, `timing`, `wall_seconds`,
`config`: the world and machine they ran on, each invocation) is kept from the committed report; what the code
concludes from the runs (sections, claims, findings) is recomputed, and report.json, report.html and figures/*.json are
written again (PNGs with --png).

Usage: python tools/rebuild_reports.py [--check] [--png] [NAME ...]   (NAME: one of REPORTS; default all of them)
--check writes nothing: it exits 1 naming every report whose recomputed numbers differ from the committed (1e-9)."""
import json, math, sys
from pathlib import Path
from flowgrpo_nb.study.compare import rebuild_report, report_from_records, write_report
from flowgrpo_nb.study.results import Report
from flowgrpo_nb.study.record import code_version

ROOT = Path(__file__).resolve().parent.parent
JUDGED = ('tasks', 'contrasts', 'findings')  # what the code concludes from the runs
KEPT = ('setup', 'timing', 'wall_seconds', 'config')  # how the runs ran: kept from the committed report
# the reports committed (a study's report is committed when its last run has finished: until then it has none)
REPORTS = [n for n in ('main', 'compare', 'study', 'confirm', 'credit', 'frontier_pilot')
           if (ROOT/'results'/n/'report.json').is_file()]

def differences(a, b, path='', tol=1e-9) -> list[str]:
    "Where JSON values `a` and `b` differ (numbers by more than `tol`)."
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f'{path}/{k}: only in one' for k in set(a) ^ set(b)]
        return out + [d for k in set(a) & set(b) for d in differences(a[k], b[k], f'{path}/{k}', tol)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b): return [f'{path}: {len(a)} items against {len(b)}']
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f'{path}[{i}]', tol)]
    num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
    if num(a) and num(b):
        same = a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol
        return [] if same else [f'{path}: {a!r} against {b!r}']
    return [] if a == b else [f'{path}: {str(a)[:80]!r} against {str(b)[:80]!r}']

def rebuilt(name:str) -> tuple[Report, dict]:
    "The report of results/`name` as this checkout's code builds it, and the committed report.json."
    folder = ROOT/'results'/name
    committed = json.loads((folder/'report.json').read_text())
    runs, fid = folder/'runs', folder/'runs'/'fidelity'/'fidelity.json'
    report = (rebuild_report(runs, fid if fid.is_file() else None) if (runs/'compare.json').is_file()
              else report_from_records(Report.from_json(committed)))
    for k in KEPT: setattr(report, k, Report.from_json(committed).__getattribute__(k))
    return report, committed

def main(argv:list[str]) -> int:
    check, png = '--check' in argv, '--png' in argv
    names = [a for a in argv if not a.startswith('--')] or REPORTS
    bad, built = 0, code_version()  # the code that builds them, read before the first report is written
    for name in names:
        report, committed = rebuilt(name)
        report.built = built
        diff = [d for k in JUDGED for d in differences(report.to_json()[k], committed[k], k)]
        said = 'the same numbers' if not diff else f"{len(diff)} differences, e.g. {'; '.join(diff[:3])}"
        print(f"results/{name}: {said}")
        if check: bad += bool(diff)
        else: write_report(report, ROOT/'results'/name, png)
    return 1 if bad else 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
