"""Docs checks that need no Quarto: the notebooks go through nbdev's processors, README.md is in sync with
nbs/index.ipynb and reads as a home page, and the offline site of `tools/docs.py` (a few pages built) reads from disk:
nothing loaded from another host (a paper's link is clickable), every local link and anchor resolves, no prompts,
one title a page, a progress bar and no warnings while it builds."""
import html, importlib.util, os, re, shutil, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT/'.venv'/'bin'

def _bin(name): return str(BIN/name) if (BIN/name).exists() else shutil.which(name) or name

def test_proc_nbs(tmp_path):
    """`nbdev-proc-nbs` (the step before Quarto in `nbdev-docs`) processes every notebook, tutorials included; on a copy
    of the notebooks and settings, so that it writes nothing in the tree (the browser test checks the tree
    meanwhile)."""
    shutil.copytree(ROOT/'nbs', tmp_path/'nbs', ignore=shutil.ignore_patterns('.ipynb_checkpoints'))
    shutil.copy(ROOT/'pyproject.toml', tmp_path/'pyproject.toml')
    r = subprocess.run([_bin('nbdev-proc-nbs')], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    proc = tmp_path/'_proc'
    for nb in ('index.ipynb', '07_viz.ipynb', 'tutorials/quickstart.ipynb', 'tutorials/sd3.ipynb'):
        if (ROOT/'nbs'/nb).exists(): assert (proc/nb).exists(), f"nbdev-proc-nbs did not write _proc/{nb}"
    assert (proc/'_quarto.yml').exists()

def _readme_from_index(tmp_path) -> str:
    "What `python tools/readme.py` writes, run on a copy so the repo's README.md is never touched."
    for p in ('tools', 'nbs/index.ipynb', 'pyproject.toml'):
        src, dst = ROOT/p, tmp_path/p
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
    (tmp_path/'flowgrpo_nb').mkdir()
    shutil.copy(ROOT/'flowgrpo_nb'/'__init__.py', tmp_path/'flowgrpo_nb'/'__init__.py')
    r = subprocess.run([sys.executable, str(tmp_path/'tools'/'readme.py')], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return (tmp_path/'README.md').read_text()

def test_readme_in_sync(tmp_path):
    assert (ROOT/'README.md').read_text() == _readme_from_index(tmp_path), \
        "README.md differs from nbs/index.ipynb: run `python tools/readme.py`"

def test_readme_has_the_two_commands():
    "The index notebook's two shell commands (set up, test) appear in README.md."
    import json
    src = '\n'.join(''.join(c['source']) for c in json.loads((ROOT/'nbs'/'index.ipynb').read_text())['cells'])
    blocks = re.findall(r'```(?:sh|bash)\n(.*?)```', src, flags=re.S)
    cmds = [l.strip() for b in blocks for l in b.splitlines() if l.strip() and not l.strip().startswith('#')]
    assert 'bash tools/main.sh' in cmds and 'bash tools/test.sh' in cmds, cmds
    readme = (ROOT/'README.md').read_text()
    for c in ('bash tools/main.sh', 'bash tools/test.sh'): assert c in readme, f"{c!r} is not in README.md"

def test_readme_first_screen():
    """The README's first screen: the two commands, where results land and how to open them; then the methods side by
    side before what the studies found, which links to its own page and holds no verdict table but the question's
    (the others are on the study's page)."""
    readme = (ROOT/'README.md').read_text()
    lines = readme.splitlines()
    top = '\n'.join(lines[:30])
    for s in ('bash tools/main.sh', 'bash tools/test.sh', 'runs/compare/', 'report.html',
              'flowgrpo app --runs runs/compare', 'glossary.ipynb'):
        assert s in top, f"{s!r} is not in the README's first 30 lines"
    heads = [l for l in lines if l.startswith('## ')]
    methods, found = heads.index('## The six methods side by side'), heads.index('## What the studies found')
    assert methods < found, heads
    table = readme[readme.index('## The six methods side by side'):readme.index('## What the studies found')]
    assert '| method, preset | credit |' in table and table.count('\n| ') >= 7, table  # a header, a row per method
    study = readme[readme.index('## What the studies found'):]
    # one claims table at most: the question's (the credit study's registered claims) right under its one-sentence
    # answer; every other verdict table belongs on nbs/study/findings.ipynb
    assert readme.count('| claim |') <= 1 and readme.count('| verdict |') <= 1, 'verdict tables belong on findings'
    if '| claim |' in readme:
        answer = study.index('**Does dense credit beat Flow-GRPO at equal compute')
        assert answer < study.index('| claim |') < study.index('- **Confirmatory**'), study[:2000]
    assert 'study/findings.ipynb' in study and 'at equal optimizer steps' in study, study[:2000]

def test_readme_is_short():
    "About 1,200 words at most, generated tables included: the detail lives on the pages it links to."
    words = len((ROOT/'README.md').read_text().split())
    assert words <= 1200, f'README.md has {words} words'

def test_home_page_imports_no_private_helper():
    "nbs/index.ipynb imports only public names (no `_name` from any module): a private helper has no contract to keep."
    import ast, json
    cells = [''.join(c['source']) for c in json.loads((ROOT/'nbs'/'index.ipynb').read_text())['cells']
             if c['cell_type'] == 'code']
    names = [a.name for src in cells for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names]
    assert names and not [n for n in names if n.split('.')[-1].startswith('_')], names

def test_new_pages_are_in_the_navigation():
    """The study's findings, Running it and Extending are pages of the site and in the navbar; every navbar link is a
    page."""
    docs = _docs()
    site = {p.as_posix() for p in docs.pages()}
    nav = dict((href, text) for text, href in docs.navbar())
    assert set(nav) <= site, set(nav) - site
    for page in ('study/findings.ipynb', 'running.ipynb', 'extending.ipynb', 'glossary.ipynb'):
        assert page in site and page in nav, page

# --- the offline site (tools/docs.py without Quarto) --------------------------------------------------------------

# The index (API links into most notebooks, the methods table), 05c_config, whose show_doc and prose link to symbols
# of other notebooks (05_credit, 04_rollout), and the pages the README sends a reader to (the study's findings, Running
# it, Extending), whose links lead into both wings: about a minute each on a loaded core.
PAGES = ('index.ipynb', '05c_config.ipynb', 'study/findings.ipynb', 'running.ipynb', 'extending.ipynb')

def _docs():
    spec = importlib.util.spec_from_file_location('docs', ROOT/'tools'/'docs.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod

@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "The pages, built by the command line as a user runs it; (folder, what the build printed)."
    out = tmp_path_factory.mktemp('site')
    r = subprocess.run([sys.executable, str(ROOT/'tools'/'docs.py'), '--out', str(out), '--only', *PAGES], cwd=ROOT,
                       capture_output=True, text=True, timeout=1200, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, r.stdout + r.stderr

def _built(out): return sorted(out.rglob('*.html'))

URL_ATTR = re.compile(r'''\s(?:href|src|action|poster|data)\s*=\s*(["'])(.*?)\1''', re.S)
OTHER_HOST = re.compile(r'\s*([a-z][a-z0-9+.-]*:)?//', re.I)

def test_build_shows_progress_and_no_warning(site):
    "The plan first (pages, workers, an estimate where a page was timed before), then a bar over the pages."
    _, log = site
    plan = re.search(rf"building {len(PAGES)} of the site's \d+ pages with \d+ worker\(s\); "
                     r"(estimated \d+ (s|min) from the pages' last times|no page timed yet: no estimate)", log)
    assert plan and plan.start() < log.index(f'{len(PAGES)}/{len(PAGES)}'), log[-2000:]
    assert f'{len(PAGES)}/{len(PAGES)}' in log, log[-2000:]  # tqdm's bar, one step a page
    assert not re.search(r'warn', log, flags=re.I), log[-3000:]  # the kernel's "running over TCP" among them

def test_a_page_named_is_built_and_an_unchanged_one_kept(site):
    """A notebook named as a path from the repository's root is a page of the site; the build's record has each page's
    content hash and time, and a page whose hash is unchanged is kept, not executed again."""
    import json
    out, _ = site
    rec = json.loads((out/'build.json').read_text())
    assert set(rec['pages']) == set(PAGES) and all(v['seconds'] > 0 and len(v['key']) == 64
                                                   for v in rec['pages'].values()), rec
    r = subprocess.run([sys.executable, str(ROOT/'tools'/'docs.py'), 'nbs/05c_config.ipynb', '--out', str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert 'nothing to build: the 1 page(s) asked for are unchanged since the last build' in r.stdout, r.stdout
    assert json.loads((out/'build.json').read_text())['pages'] == rec['pages']

def test_no_link_to_another_host(site):
    """No src or href that loads something (script, link, img...) and no CSS url() or @import leads to another host;
    a link a reader clicks (`<a href>`, a paper) may, and the index has some."""
    out, _ = site
    clicked = re.compile(r'''(<a\s[^>]*?href=)(["'])https?://[^"']*\2''')
    assert clicked.search((out/'index.html').read_text())  # the papers of the README's first lines
    for page in _built(out):
        s = clicked.sub(r'\1""', page.read_text())
        other = [u for _, u in URL_ATTR.findall(s) if OTHER_HOST.match(u)]
        other += (re.findall(r'''url\(\s*["']?\s*(?:https?:)?//[^)]*\)''', s)
                  + re.findall(r'''@import\s+(?:url\()?["']?(?:https?:)?//[^"')]*''', s))
        assert not other, (page.name, sorted(set(other))[:10])

def test_local_links_and_anchors_resolve(site):
    """Every internal link of the built pages (href, src..., anchors included) leads to a file, and an anchor to an
    element id of that file; a page `--only` left out must at least be a page of the site (it is there after a full
    build). A failure names every page and link that lead nowhere."""
    out, _ = site
    docs = _docs()
    bad = docs.broken_links(out)
    assert not bad, f'{len(bad)} internal link(s) lead nowhere:\n' + '\n'.join(f'{p}: {u} ({w})' for p, u, w in bad)
    across = 0
    for page in _built(out):
        for _, url in URL_ATTR.findall(page.read_text()):
            path, _, anchor = html.unescape(url).partition('#')
            across += bool(path.endswith('.html') and anchor and (page.parent/path).resolve() != page.resolve()
                           and (page.parent/path).exists())
    assert across >= 3, across  # the index's API links into 05c_config were among them
    assert re.search(r'''href=["']05c_config\.html#grpoconfig["']''', (out/'index.html').read_text())  # `GRPOConfig`

def test_the_link_walk_names_each_page_and_link(tmp_path):
    """The walk over a built site finds a missing file, a missing anchor (on another page and on the same one) and a
    missing image, and accepts a page of the site that was not built, a heading's anchor, another host and the text of
    a code listing."""
    docs = _docs()
    (tmp_path/'study').mkdir()
    (tmp_path/'05_credit.html').write_text('<h2 id="compute_credit">x</h2><a href="#compute_credit">ok</a>'
                                          '<a href="#gone">same page</a><img src="missing.png">'
                                          '<pre><span>html = f"&lt;script src="</span>{PLOTLY_JS}"</pre>')
    (tmp_path/'study'/'findings.html').write_text(
        '<a href="../05_credit.html#compute_credit">ok</a><a href="../05_credit.html#nope">bad anchor</a>'
        '<a href="../07_viz.html">not built, a page of the site</a><a href="../no_such_page.html">gone</a>'
        '<a href="https://arxiv.org/abs/2505.05470">a paper</a><script src="../plotly.min.js"></script>')
    (tmp_path/'plotly.min.js').write_text('')
    assert sorted(docs.broken_links(tmp_path)) == [
        ('05_credit.html', '#gone', "no id 'gone' there"), ('05_credit.html', 'missing.png', 'no such file'),
        ('study/findings.html', '../05_credit.html#nope', "no id 'nope' there"),
        ('study/findings.html', '../no_such_page.html', 'no such file')]

def test_findings_page_holds_the_verdicts(site):
    """The verdict tables the README left: the study's page has the confirmatory and exploratory claims with their
    verdicts, the quick comparison's tables, and that comparison's findings folded."""
    out, _ = site
    page = (out/'study'/'findings.html').read_text()
    for s in ('the-confirmatory-study', 'the-exploratory-study', 'the-quick-comparison', '<details>', 'verdict',
              'holds (&gt; 0)', 'undecided at this power', 'not distinguishable'):
        assert s in page, f'{s!r} is not on the findings page'

def test_no_prompts(site):
    out, _ = site
    for page in _built(out):
        m = re.search(r'.{0,80}\b(In|Out)(&nbsp;|\s)*\[\s*\d*\s*\]', page.read_text())
        assert not m, (page.name, m.group(0))

def test_one_title_a_page(site):
    out, _ = site
    docs = _docs()
    name = docs.site_name()
    want = {'index.html': name, '05c_config.html': f"{docs.title_of(ROOT/'nbs'/'05c_config.ipynb')} – {name}"}
    for page, title in want.items():
        assert re.findall(r'<title>(.*?)</title>', (out/page).read_text(), flags=re.S) == [html.escape(title)], page
    assert name == 'flowgrpo_nb'

def test_source_links_only_when_asked():
    """show_doc's source links (to the code host) are dropped unless `--source-links`; a paper's link stays a link, its
    address shown."""
    docs = _docs()
    st = docs._settings()
    body = (f'<p><a href="{st["git"]}blob/main/flowgrpo_nb/credit.py#L82">source</a></p><h3>compute_credit</h3>'
            f'<a href="{st["doc"]}credit.html#compute_credit"><code>compute_credit</code></a>'
            '<a href="https://arxiv.org/abs/2505.05470">Flow-GRPO</a>')
    pages = [Path('index.ipynb'), Path('05_credit.ipynb'), Path('tutorials/quickstart.ipynb')]
    off = docs.offline_links(body, Path('tutorials/quickstart.ipynb'), pages)
    assert st['git'] not in off and 'source' not in off and '<p>' not in off
    assert '<a href="../05_credit.html#compute_credit"><code>compute_credit</code></a>' in off
    assert ("<a href='https://arxiv.org/abs/2505.05470' rel='noopener'>Flow-GRPO</a> "
            "<span class='ext-url'>(arxiv.org/abs/2505.05470)</span>") in off  # a paper: clickable, its address shown
    assert f'{st["git"]}blob/main/flowgrpo_nb/credit.py#L82' in \
        docs.offline_links(body, Path('index.ipynb'), pages, source_links=True)

def test_heading_ids_are_quartos():
    docs = _docs()
    assert [docs.slug(t) for t in ('GRPOTrainer', 'GRPOTrainer.step', "The workers' fork server", '2. Speed',
                                   'step_spans')] == \
        ['grpotrainer', 'grpotrainer.step', 'the-workers-fork-server', 'speed', 'step_spans']
    assert docs.heading_ids('<h2>Speed</h2><h2>Speed</h2><h3 id="x">X</h3>') == \
        '<h2 id="speed">Speed</h2><h2 id="speed-1">Speed</h2><h3 id="x">X</h3>'

def test_the_kernel_client_waits_in_slices():
    """The docs build's channels ask zmq for at most a slice at a time (a missed wakeup costs a slice, not the cell's
    timeout), and still time out."""
    import asyncio
    from queue import Empty
    docs = _docs()
    class Channel:  # answers on the fourth look
        def __init__(self): self.asked = []
        async def get_msg(self, timeout=None):
            self.asked.append(timeout)
            if len(self.asked) < 4: await asyncio.sleep(0.01); raise Empty
            return 'reply'
        def is_alive(self): return True
    docs._Polled.SLICE = 0.05
    ch = Channel(); polled = docs._Polled(ch)
    assert asyncio.run(polled.get_msg(timeout=600)) == 'reply' and max(ch.asked) <= 0.05 and len(ch.asked) == 4
    ch = Channel()
    assert asyncio.run(docs._Polled(ch).get_msg()) == 'reply' and max(ch.asked) <= 0.05, 'no timeout: slices too'
    class Never(Channel):
        async def get_msg(self, timeout=None): self.asked.append(timeout); await asyncio.sleep(timeout); raise Empty
    with pytest.raises(Empty): asyncio.run(docs._Polled(Never()).get_msg(timeout=0.2))
    assert docs._Polled(ch).is_alive(), "everything else is the channel's"
