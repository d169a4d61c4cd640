"The committed reports are what this checkout's code concludes from their kept runs: every number again, to 1e-9."
import importlib.util, json
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location('rebuild_reports', ROOT/'tools'/'rebuild_reports.py')
rb = importlib.util.module_from_spec(spec); spec.loader.exec_module(rb)

@pytest.mark.parametrize('name', rb.REPORTS)
def test_committed_report_is_rebuilt_from_its_runs(name):
    report, committed = rb.rebuilt(name)
    new = report.to_json()
    for k in rb.JUDGED:
        diff = rb.differences(new[k], committed[k], k)
        assert not diff, f'results/{name}: {len(diff)} differences, e.g. {diff[:5]}'
    assert new['contrasts'] and all(new['tasks'][t]['comparisons'] for t in new['tasks'])  # something was judged

def test_differences_sees_a_change_beyond_the_tolerance():
    a = dict(x=[1.0, dict(y=0.5)], s='held')
    assert rb.differences(a, json.loads(json.dumps(a))) == []
    assert rb.differences(a, dict(x=[1.0 + 1e-12, dict(y=0.5)], s='held')) == []
    assert rb.differences(a, dict(x=[1.0 + 1e-6, dict(y=0.5)], s='held')) == ['/x[0]: 1.0 against 1.000001']
    assert rb.differences(a, dict(x=[1.0], s='held')) == ['/x: 2 items against 1']
    assert rb.differences(a, dict(x=[1.0, dict(y=0.5)], s='not')) == ["/s: 'held' against 'not'"]

def test_every_committed_report_has_the_figure_files_the_app_shows():
    from flowgrpo_nb.app import REPORT_FIGURES
    assert {'main', 'compare', 'study', 'confirm'} <= set(rb.REPORTS)
    for name in rb.REPORTS:
        tasks = json.loads((ROOT/'results'/name/'report.json').read_text())['tasks']
        for t in tasks:
            have = {k for k in REPORT_FIGURES if (ROOT/'results'/name/'figures'/f'{t}_{k}.json').is_file()}
            assert {'curve_steps', 'curve_seconds', 'differences'} <= have, (name, t, have)
