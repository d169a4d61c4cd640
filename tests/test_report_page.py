"""A committed report as a newcomer opens it: Chromium at 1280x800, offline (every request to another host blocked).
It is small (plotly.js is one shared file beside it, not inlined), its first figure is whole on the first screen and
not repeated further down, and no legend is clipped (none scrolls, none leaves its figure)."""
import html, json, re
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
# the reports whose page was written with a shared plotly.js (a report rebuilt by tools/rebuild_reports.py has it)
REPORTS = sorted(p.parent for p in (ROOT/'results').glob('*/report.html') if (p.parent/'plotly.min.js').is_file())

def test_some_report_has_its_shared_plotly():
    assert REPORTS, 'no committed report has plotly.min.js beside it: rebuild one with tools/rebuild_reports.py'

@pytest.mark.parametrize('folder', REPORTS, ids=lambda p: p.name)
def test_report_is_small_and_draws_with_the_shared_plotly(folder):
    page = (folder/'report.html').read_text()
    assert (folder/'report.html').stat().st_size < 1_000_000, (folder/'report.html').stat().st_size
    assert "<script src='plotly.min.js'" in page and '* plotly.js v' not in page

LEGENDS = """() => [...document.querySelectorAll('.plotly-graph-div')].map(g => {
    const svg = g.querySelector('.main-svg').getBoundingClientRect(), out = [];
    for (const l of g.querySelectorAll('.legend')) {
        const b = l.getBoundingClientRect(), bar = l.querySelector('.scrollbar');
        if (bar && bar.getBoundingClientRect().height > 0) out.push('its legend scrolls');
        if (b.left < svg.left - 1 || b.right > svg.right + 1 || b.top < svg.top - 1 || b.bottom > svg.bottom + 1)
            out.push('its legend leaves the figure');
    }
    return [g.id || (g.querySelector('.gtitle') || {}).textContent || '?', out];
}).filter(([_, out]) => out.length)"""

@pytest.mark.chrome
@pytest.mark.parametrize('folder', REPORTS, ids=lambda p: p.name)
def test_first_figure_whole_and_legends_not_clipped(chromium, folder):
    page = chromium.new_page(viewport=dict(width=1280, height=800))
    errors, other_hosts = [], []
    page.on('pageerror', lambda e: errors.append(str(e)))
    page.route('**/*', lambda r: r.continue_() if r.request.url.startswith('file:')
               else (other_hosts.append(r.request.url), r.abort()))
    page.goto((folder/'report.html').as_uri(), wait_until='load')
    n = page.locator('.plotly-graph-div').count()
    page.wait_for_function(f'document.querySelectorAll(".plotly-graph-div .main-svg").length >= {n}', timeout=60_000)
    first = page.evaluate("(() => { const b = document.querySelector('.plotly-graph-div').getBoundingClientRect();"
                          " return [b.top, b.bottom, b.right]; })()")
    assert first[0] >= 0 and first[1] <= 800 and first[2] <= 1280, f'the first figure spans {first}, not 1280x800'
    titles = page.evaluate("[...document.querySelectorAll('.plotly-graph-div .gtitle')].map(t => t.textContent)")
    assert len(titles) == len(set(titles)), f'a figure is shown twice: {titles}'
    assert page.evaluate(LEGENDS) == []
    assert not errors and not other_hosts, (errors, other_hosts)

FRONTIERS = [f for f in REPORTS if json.loads((f/'report.json').read_text()).get('budget', {}).get('frontier')]

@pytest.mark.parametrize('folder', FRONTIERS, ids=lambda p: p.name)
def test_a_frontier_report_opens_on_its_frontier_then_its_answer(folder):
    """A budget whose report is a frontier (the pilot, the frontier study): a pilot's label, the frontier figure, the
    answer whose numbers are the frontier's as computed from report.json, then the rest."""
    from flowgrpo_nb.study.results import Report
    from flowgrpo_nb.study.cpu_frontier import report_frontier
    report = Report.from_json(json.loads((folder/'report.json').read_text()))
    page, fr = (folder/'report.html').read_text(), report_frontier(report)
    i = page.index
    assert i('<h2>The answer</h2>') < i('id="headline"') < i('Which method to run') < i('<h2>Setup</h2>')
    if (label := report.budget.get('exploratory')): assert i(html.escape(label)) < i('id="headline"')
    assert 'against training CPU seconds' in page[i('id="headline"'):i('Which method to run')]
    for k, end in ((0, 'small'), (-1, 'large')):
        a = fr.leader[k]
        assert html.escape(f"at the {end}-budget end, {fr.seconds[k]:,.0f} CPU s, {a} is highest "
                           f"({fr.mean[a][k]:.3f}") in page
    assert all(f"{c['seconds']:,.0f} CPU s ({c['before']} to {c['after']})" in page for c in fr.crossings)
    assert any((folder/'figures').glob('*_frontier.json'))
