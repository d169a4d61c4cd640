"""Build the docs site: `python tools/docs.py [NB ...] [--out DIR] [--jobs N] [--force] [--quarto]`.

Where Quarto is installed (or with `--quarto`) this is `nbdev-docs`. Where it is not (Quarto has no wheel or Debian
package, and many offline clusters lack it), the same pages, in the same order and with the same navigation, are
built in plain Python:

1. each notebook is executed in a Jupyter kernel (nbclient), skipping the cells `nbdev-test` skips (`#| eval: false`
   and the flags in `tst_flags`: slow, gpu, chrome), with the widgets' state stored;
2. nbdev's own processing for docs (`FilterDefaults`: titles, `#| hide`, `show_doc`, exports) runs on the result;
3. nbconvert writes each page's HTML; plotly figures, which the notebooks hand over as JSON (`display.RENDERER`),
   become HTML that draws with the one `plotly.min.js` the site ships (copied from the installed plotly), and a
   dashboard's widgets are drawn from their stored state (tabs, boxes, the controls' values, the figures in them);
4. every page gets the navbar of `nbs/_quarto.yml` and the sidebar nbdev would generate (index first, then the
   numbered notebooks, then each folder as a section), and links to notebooks point to their pages;
5. the pages are for reading offline: nbdev's API links (written for the published site, `doc_host`/`doc_baseurl`)
   lead to the local page and heading (headings get Quarto's ids), a link to another host (a paper) stays a link with
   its address shown, the "source" links to the code host are left out (`--source-links` keeps them), no prompts.

Nothing is fetched: the pages open from disk, offline (`_docs/index.html`). Naming notebooks (`python tools/docs.py
nbs/05_credit.ipynb`, or `--only 05_credit.ipynb`) builds those pages only (the others still appear in the navigation),
which is what the tests do.

The build keeps a record, `build.json` in the site's folder: each page's time and the content hash of what it was
built from (its notebook, the package's sources, this script, the site's pages and titles). Before it starts it says
how many pages it builds and about how long that takes (the record's times, or `results/docs/build.json`'s, the
committed record of a whole build on this machine, for pages it has not timed); a page whose hash is unchanged is kept
as it is (`--force` builds it again); pages run in parallel, `--jobs` at a time, each in a kernel of its own with one
thread. `--record FILE` copies the record there when every page is in the site."""
import argparse, hashlib, html, json, os, re, shutil, subprocess, sys, tempfile, threading, time, unicodedata
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from urllib.parse import urljoin
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'
PLOTLY_MIME = 'application/vnd.plotly.v1+json'
WIDGET_VIEW = 'application/vnd.jupyter.widget-view+json'
WIDGET_STATE = 'application/vnd.jupyter.widget-state+json'

def pages(nbs:Path=NBS) -> list[Path]:
    """The notebooks of the site in the sidebar's order (nbdev's): index first, then files, then each folder's (paths
    relative to `nbs`)."""
    def key(p:Path): return (len(p.parts) > 1, p.parts[:-1], p.name != 'index.ipynb', p.name)
    found = [p.relative_to(nbs) for p in nbs.rglob('*.ipynb')
             if not any(part.startswith(('_', '.')) for part in p.relative_to(nbs).parts)]
    return sorted(found, key=key)

def navbar(nbs:Path=NBS) -> list[tuple[str, str]]:
    "(text, notebook) of `_quarto.yml`'s navbar."
    import yaml
    cfg = yaml.safe_load((nbs/'_quarto.yml').read_text())
    return [(i['text'], i['href']) for i in cfg.get('website', {}).get('navbar', {}).get('left', []) if 'href' in i]

# ---------------------------------------------------------------------------------------------- 1. execution

def run_cells(path:Path) -> set:
    "Ids of the cells `nbdev-test` runs in the notebook at `path`."
    from nbdev.config import get_config
    from nbdev.test import nb_test_cells
    return {c.id for c in nb_test_cells(path, skip_flags=get_config().tst_flags.split())}

def execute(path:Path, timeout:int=600, tries:int=2):
    """The notebook at `path` executed in a kernel (cwd: its folder), widget state stored; cells nbdev-test skips are
    not run."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    for i in range(tries):
        try: return _execute(path, timeout)
        # a kernel that stalls (seen now and then on a loaded machine): once more
        except (CellTimeoutError, DeadKernelError):
            if i == tries - 1: raise

class _Polled:
    """A kernel client's channel whose `get_msg` waits in slices of `SLICE` seconds. zmq's asyncio poll now and then
    misses the event of a message that has arrived: on 07_viz's dashboard cells the client and the kernel both sat idle
    for the whole cell timeout (150 s of 150, 600 of 600), then the reply was read at once. A wait that looks at the
    socket again every slice loses at most a slice."""
    SLICE = 1.0
    def __init__(self, channel): self._channel = channel
    def __getattr__(self, name): return getattr(self._channel, name)
    async def get_msg(self, timeout=None):
        from queue import Empty
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = self.SLICE if end is None else min(self.SLICE, max(0.0, end - time.monotonic()))
            try: return await self._channel.get_msg(timeout=left)
            except Empty:
                if end is not None and time.monotonic() >= end: raise

def PollingClient(*args, **kw):
    """An nbclient `NotebookClient` whose shell and IOPub channels wait in slices (`_Polled`); `execute()` only (the
    async path)."""
    from nbclient import NotebookClient
    class Client(NotebookClient):
        async def async_start_new_kernel_client(self):
            kc = await super().async_start_new_kernel_client()
            kc._shell_channel, kc._iopub_channel = _Polled(kc.shell_channel), _Polled(kc.iopub_channel)
            return kc
    return Client(*args, **kw)

def _execute(path:Path, timeout:int):
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    keep = run_cells(path)
    skipped = {}
    for c in nb.cells:
        if c.cell_type == 'code' and c.id not in keep: skipped[c.id], c.source = c.source, ''
    from traitlets.config import Config
    with tempfile.TemporaryDirectory(prefix='docs-kernel-') as sockets:
        # the kernel talks over local sockets (ipc), not unencrypted TCP: no port open, nothing to warn about
        c = Config()
        if os.name == 'posix': c.KernelManager.transport, c.KernelManager.ip = 'ipc', str(Path(sockets)/'k')
        PollingClient(nb, timeout=timeout, kernel_name='python3', store_widget_state=True, allow_errors=False, config=c,
                      resources={'metadata': {'path': str(path.parent)}}).execute()
    for c in nb.cells:
        if c.id in skipped: c.source, c.outputs = skipped[c.id], []
    return nb

# ---------------------------------------------------------------------------------------------- 2. nbdev's processing

def process(nb, path:Path):
    "nbdev's docs processing (`FilterDefaults`) of the executed notebook of `path`; (title, description, notebook)."
    import nbformat
    from fastcore.nbio import dict2nb
    from nbdev.processors import FilterDefaults
    d = dict2nb(json.loads(nbformat.writes(nb)))
    d.path_ = path
    with warnings.catch_warnings():
        # nbdev's advice on cells mixing imports and code is for authors, not for a build
        warnings.simplefilter('ignore')
        FilterDefaults()(d)
    d.pop('path_', None)
    keys = ('cell_type', 'id', 'metadata', 'source', 'outputs', 'execution_count', 'attachments')
    d['cells'] = [{k: v for k, v in c.items() if k in keys} for c in d['cells']]  # nbdev's working fields dropped
    for c in d['cells']: c['metadata'] = {k: v for k, v in c.get('metadata', {}).items() if k != 'execution'}
    out = nbformat.reads(json.dumps(d, default=str), as_version=4)
    title = desc = ''
    if out.cells and out.cells[0].cell_type == 'raw' and out.cells[0].source.startswith('---'):
        import yaml
        fm = yaml.safe_load(out.cells[0].source.strip().strip('-')) or {}
        title, desc = fm.get('title', ''), fm.get('description', '')
        out.cells = out.cells[1:]
    out.metadata = nb.metadata  # the widget state
    return title, desc, out

def directives(cell) -> dict:
    "The `#| key: value` lines that open a cell."
    d = {}
    for line in cell.source.splitlines():
        if not line.startswith('#|'): break
        k, _, v = line[2:].strip().partition(':')
        d[k.strip()] = v.strip()
    return d

def tag_cells(nb):
    """Quarto's cell options as nbconvert tags: `echo: false` hides the code, `output: false` the outputs, `include:
    false` both."""
    for c in nb.cells:
        if c.cell_type != 'code': continue
        d, tags = directives(c), set(c.metadata.get('tags', []))
        if d.get('echo') == 'false': tags.add('remove_input')
        if d.get('output') == 'false': tags.add('remove_output')
        if d.get('include') == 'false': tags.add('remove_cell')
        c.source = '\n'.join(l for l in c.source.splitlines() if not l.startswith('#|')).strip('\n')
        c.metadata['tags'] = sorted(tags)
    return nb

# ---------------------------------------------------------------------------------------------- 3. figures and widgets

def figure_html(fig:dict) -> str:
    """A plotly figure's JSON as HTML drawn with the page's plotly.js, as wide as its container unless the figure fixes
    a width."""
    import plotly.io as pio
    return pio.to_html(fig, include_plotlyjs=False, include_mathjax=False, full_html=False, default_width='100%',
                       config={'responsive': True, 'displaylogo': False}, validate=False, auto_play=False)

def output_html(o:dict, state:dict) -> str:
    "One output (of a cell or of an Output widget) as HTML."
    if o.get('output_type') == 'stream': return f"<pre class='stream'>{html.escape(''.join(o.get('text', '')))}</pre>"
    if o.get('output_type') == 'error':
        return f"<pre class='error'>{html.escape(o.get('ename', ''))}: {html.escape(o.get('evalue', ''))}</pre>"
    data = o.get('data', {})
    if PLOTLY_MIME in data: return figure_html(data[PLOTLY_MIME])
    if WIDGET_VIEW in data: return widget_html(data[WIDGET_VIEW]['model_id'], state)
    if 'text/html' in data: return ''.join(data['text/html'])
    if 'text/markdown' in data:
        from nbconvert.filters import markdown2html
        return markdown2html(''.join(data['text/markdown']))
    for k in ('image/png', 'image/jpeg'):
        if k in data: return f"<img src='data:{k};base64,{''.join(data[k]).strip()}'>"
    if 'text/plain' in data: return f"<pre>{html.escape(''.join(data['text/plain']))}</pre>"
    return ''

_TAB_IDS = iter(range(10**9))

def widget_html(model_id:str, state:dict) -> str:
    """A widget drawn from its stored state: boxes and tabs around their children, an Output's outputs, a control's
    value."""
    w = state.get(model_id)
    if w is None: return ''
    s, kind = w['state'], w['model_name']
    lay = state.get(str(s.get('layout', '')).removeprefix('IPY_MODEL_'), {}).get('state', {})
    if lay.get('display') == 'none': return ''
    kids = [widget_html(c.removeprefix('IPY_MODEL_'), state) for c in s.get('children', [])]
    label = html.escape(s.get('description', ''))
    if kind == 'TabModel':
        t, titles = next(_TAB_IDS), s.get('titles') or [str(i) for i in range(len(kids))]
        sel = s.get('selected_index') or 0
        heads = ''.join(f"<button class='w-tab-head{' on' * (i == sel)}' onclick='wTab(this, {i})'>"
                        f"{html.escape(str(h))}</button>"
                        for i, h in enumerate(titles))
        panels = ''.join(f"<div class='w-tab-panel' style='display:{'block' if i == sel else 'none'}'>{k}</div>"
                         for i, k in enumerate(kids))
        return f"<div class='w-tab' id='w-tab-{t}'><div class='w-tab-heads'>{heads}</div>{panels}</div>"
    if kind in ('VBoxModel', 'HBoxModel', 'BoxModel', 'GridBoxModel'):
        return f"<div class='w-box {'w-hbox' if kind == 'HBoxModel' else 'w-vbox'}'>{''.join(kids)}</div>"
    if kind == 'OutputModel': return ''.join(output_html(o, state) for o in s.get('outputs', []))
    if kind in ('DropdownModel', 'SelectModel', 'RadioButtonsModel', 'ToggleButtonsModel'):
        labels, i = s.get('_options_labels', []), s.get('index')
        value = labels[i] if isinstance(i, int) and i < len(labels) else ''
        return (f"<div class='w-control'><label>{label}</label> "
                f"<span class='w-value'>{html.escape(str(value))}</span></div>")
    if 'value' in s and not isinstance(s['value'], (dict, list)):
        rng = f" ({s['min']}–{s['max']})" if 'min' in s and 'max' in s else ''
        if kind in ('HTMLModel', 'HTMLMathModel'): return f"<div>{s['value']}</div>"
        return (f"<div class='w-control'><label>{label}</label> "
                f"<span class='w-value'>{html.escape(str(s['value']))}</span>{rng}</div>")
    return ''

def render_outputs(nb):
    "Replace plotly figures and widgets in the outputs by the HTML they draw as (nbconvert shows text/html)."
    state = nb.metadata.get('widgets', {}).get(WIDGET_STATE, {}).get('state', {})
    for c in nb.cells:
        for o in c.get('outputs', []):
            data = o.get('data', {})
            if PLOTLY_MIME in data or WIDGET_VIEW in data:
                o['data'] = {'text/html': output_html(o, state)}
    nb.metadata.pop('widgets', None)  # drawn above; nbconvert would otherwise load a widget manager from a CDN
    return nb

# ---------------------------------------------------------------------------------------------- 4. pages

CSS = """
body{margin:0;font-family:system-ui,-apple-system,'Segoe UI',sans-serif;color:#212529}
header{background:#2780e3;color:#fff;padding:.5em 1.5em;display:flex;gap:1.5em;align-items:center;flex-wrap:wrap}
header a{color:#fff;text-decoration:none} header .site{font-weight:600;font-size:1.15em}
.layout{display:flex;align-items:flex-start}
nav.sidebar{flex:0 0 230px;padding:1em;font-size:.9em;position:sticky;top:0;max-height:100vh;overflow:auto;
box-sizing:border-box}
nav.sidebar a{display:block;padding:.15em 0;color:#333;text-decoration:none}
nav.sidebar a.on{font-weight:600;color:#2780e3}
nav.sidebar .section{margin-top:.8em;font-weight:600;color:#555}
main{flex:1 1 auto;min-width:0;max-width:1000px;padding:1em 2em;box-sizing:border-box}
main .description{font-size:1.1em;color:#555}
.jp-Cell,.jp-OutputArea-output{max-width:100%;overflow-x:auto}
.jp-InputPrompt,.jp-OutputPrompt,.jp-InputArea-prompt,.jp-OutputArea-prompt{display:none}
pre{background:#f7f7f7;padding:.5em;overflow-x:auto}
table{border-collapse:collapse} th,td{border:1px solid #ddd;padding:.2em .5em}
main table{display:block;max-width:100%;overflow-x:auto;width:max-content}
.ext-url{color:#666;font-size:.9em}
.w-hbox{display:flex;gap:1em;flex-wrap:wrap} .w-control{margin:.2em 0;color:#444} .w-control label{font-weight:600}
.w-tab-heads{border-bottom:1px solid #ccc;margin:.5em 0}
.w-tab-head{border:1px solid #ccc;border-bottom:none;background:#f3f3f3;
padding:.3em .8em;cursor:pointer} .w-tab-head.on{background:#fff;font-weight:600}
"""

TAB_JS = """function wTab(b, i){const t=b.closest('.w-tab');
t.querySelectorAll(':scope>.w-tab-heads>.w-tab-head').forEach((h,j)=>h.classList.toggle('on',j===i));
t.querySelectorAll(':scope>.w-tab-panel').forEach((p,j)=>p.style.display=j===i?'block':'none');
window.dispatchEvent(new Event('resize'));}"""

def figure_css() -> str:
    "Figures as wide as the output area, up to the width they are designed for (`display.MAX_WIDTH`, JupyterLab's)."
    from flowgrpo_nb.display import MAX_WIDTH
    return f".plotly-graph-div{{max-width:{MAX_WIDTH}px}}"

def site_name(nbs:Path=NBS) -> str:
    "The site's title (`website.title` of `nbs/nbdev.yml`, else the repository's name)."
    import yaml
    f = nbs/'nbdev.yml'
    cfg = (yaml.safe_load(f.read_text()) or {}) if f.exists() else {}
    return cfg.get('website', {}).get('title') or ROOT.name

def page_title(rel:Path, title:str, site:str) -> str:
    "The `<title>`: the site's name on the index, '<notebook title> – <site>' elsewhere."
    title = title or rel.stem
    return site if rel == Path('index.ipynb') or title == site else f'{title} – {site}'

def page_html(rel:Path, title:str, desc:str, body:str, all_pages:list, titles:dict, nav:list, site:str='flowgrpo_nb',
              source_links:bool=False) -> str:
    "One page: the navbar, the sidebar, the title and the notebook's HTML; links between notebooks lead to pages."
    up = '../' * (len(rel.parts) - 1)
    href = lambda p: up + str(Path(p).with_suffix('.html'))
    side, section = [], None
    for p in all_pages:
        if len(p.parts) > 1 and p.parts[0] != section:
            section = p.parts[0]; side.append(f"<div class='section'>{html.escape(section)}</div>")
        side.append(f"<a href='{href(p)}' class='{'on' if p == rel else ''}'>"
                    f"{html.escape(titles.get(p) or p.stem)}</a>")
    top = ''.join(f"<a href='{href(h)}'>{html.escape(t)}</a>" for t, h in nav)
    body = re.sub(r'''(href=["'])(?!https?:|#|mailto:)([^"'#]+?)\.ipynb(#[^"']*)?(["'])''', r'\1\2.html\3\4', body)
    body = re.sub(r'\{target="_blank"[^}]*\}', '', body)  # Quarto's link attributes in show_doc's markdown
    body = offline_links(heading_ids(body), rel, all_pages, source_links)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{html.escape(page_title(rel, title, site))}</title><script src='{up}plotly.min.js'></script>"
            f"<style>{CSS}{figure_css()}</style><script>{TAB_JS}</script></head><body>"
            f"<header><a class='site' href='{href('index.ipynb')}'>{html.escape(site)}</a>{top}</header>"
            f"<div class='layout'><nav class='sidebar'>{''.join(side)}</nav><main><h1>{html.escape(title)}</h1>"
            + (f"<p class='description'>{html.escape(desc)}</p>" if desc else '')
            + f"{body}</main></div></body></html>")

# ---------------------------------------------------------------------------------------------- 5. links, offline

IDS = re.compile(r'''\sid=["']([^"']+)["']''')

def slug(text:str) -> str:
    """Pandoc's (so Quarto's) id of a heading's text: lower case, words joined by '-', only letters, digits and `_-.`
    kept."""
    s = '-'.join(unicodedata.normalize('NFC', text).lower().split())
    s = ''.join(ch for ch in s if ch.isalnum() or ch in '_-.')
    i = next((i for i, ch in enumerate(s) if ch.isalpha()), len(s))  # an id starts with a letter
    return s[i:] or 'section'

def _text(fragment:str) -> str: return html.unescape(re.sub(r'<[^>]+>', '', fragment))

def heading_ids(body:str) -> str:
    "Every heading without an id gets Quarto's (`### GRPOTrainer` -> `grpotrainer`; a repeated one `-1`, `-2`...)."
    seen = set(IDS.findall(body))
    def add(m):
        if IDS.search(m.group(2) or ''): return m.group(0)
        base = slug(_text(m.group(3))); i, id_ = 0, base
        while id_ in seen: i += 1; id_ = f'{base}-{i}'
        seen.add(id_)
        return f'<h{m.group(1)} id="{id_}"{m.group(2) or ""}>{m.group(3)}</h{m.group(1)}>'
    return re.sub(r'<h([1-6])(\s[^>]*)?>(.*?)</h\1>', add, body, flags=re.S)

def nbpath2html(p) -> Path:
    """nbdev's name of a notebook's page on the published site (numeric prefix dropped): `05_credit.ipynb` ->
    `credit.html`."""
    from nbdev.config import nbpath2html as f
    return f(p)

def _settings() -> dict:
    "The addresses nbdev made the links with: the published site's (`doc_host` + `doc_baseurl`), the code host's."
    from nbdev.config import get_config
    cfg = get_config(ROOT)
    return {'doc': urljoin(cfg.doc_host.rstrip('/') + '/', cfg.doc_baseurl.strip('/') + '/'),
            'git': cfg.git_url.rstrip('/') + '/'}

OTHER_HOST = re.compile(r'^\s*(?:[a-z][a-z0-9+.-]*:)?//', re.I)
HREF = re.compile(r'''\shref=(["'])(.*?)\1''', re.S)

def offline_links(body:str, rel:Path, all_pages:list, source_links:bool=False) -> str:
    """Links for reading from disk: an API link to the published site leads to the local page (`05_credit.html#...`),
    a source link to the code host is dropped (kept with `source_links`), any other link to another host stays a link,
    followed by its address where the text is not code (so that a printed paper can still be looked up)."""
    st, up = _settings(), '../' * (len(rel.parts) - 1)
    local = {nbpath2html(p).as_posix(): p for p in all_pages}
    docs = {st['doc'], re.sub(r'^https:', 'http:', st['doc']), re.sub(r'^http:', 'https:', st['doc'])}
    def fix(m):
        attrs, text = m.group(1), m.group(2)
        h = HREF.search(attrs)
        if not h or not OTHER_HOST.match(h.group(2)): return m.group(0)
        url = html.unescape(h.group(2)).strip()
        base = next((b for b in docs if url.startswith(b)), None)
        if base:
            page, _, anchor = url[len(base):].partition('#')
            if page in local:
                target = up + local[page].with_suffix('.html').as_posix() + (f'#{anchor}' if anchor else '')
                return f'<a href="{html.escape(target)}">{text}</a>'
        if url.startswith(st['git']): return m.group(0) if source_links else ''
        # a link to another host stays a link (a click, when online, opens the paper; nothing is fetched), with its
        # address shown after a text that is not code or the address itself (printed, it can still be looked up)
        a = f"<a href='{html.escape(url)}' rel='noopener'>{text}</a>"
        if '<code' in text or _text(text).strip() == url: return a
        shown = re.sub(r'^[a-z]+://(www\.)?', '', url).rstrip('/')
        return f"{a} <span class='ext-url'>({html.escape(shown)})</span>"
    body = re.sub(r'<a\b([^>]*)>(.*?)</a>', fix, body, flags=re.S)
    return body if source_links else re.sub(r'<p>\s*</p>', '', body)  # the paragraphs the source links stood in

def check_anchors(out:Path, written:list) -> int:
    """A link whose anchor is not on the page it leads to (a symbol without a heading of its own) leads to the page;
    an in-page link to a missing anchor becomes text. The number of links changed."""
    ids, changed = {}, 0
    def known(path:Path):
        if path not in ids: ids[path] = set(IDS.findall(path.read_text())) if path.exists() else None
        return ids[path]
    link = re.compile(r'''<a href=(["'])([^"'#:]*?\.html)?#([^"']+)\1([^>]*)>(.*?)</a>''', re.S)
    for page in written:
        s = page.read_text()
        def fix(m):
            nonlocal changed
            q, target, anchor = m.group(1), m.group(2), html.unescape(m.group(3))
            have = known((page.parent/target).resolve() if target else page.resolve())
            if have is None or anchor in have: return m.group(0)
            changed += 1
            return f'<a href={q}{target}{q}{m.group(4)}>{m.group(5)}</a>' if target else m.group(5)
        new = link.sub(fix, s)
        if new != s: page.write_text(new)
    return changed

def notebook_body(nb) -> str:
    "The notebook's cells as HTML (nbconvert, lab styles, no page wrapper)."
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    c = Config()
    c.TagRemovePreprocessor.enabled = True
    c.TagRemovePreprocessor.remove_input_tags = {'remove_input'}
    c.TagRemovePreprocessor.remove_all_outputs_tags = {'remove_output'}
    c.TagRemovePreprocessor.remove_cell_tags = {'remove_cell'}
    body, _ = HTMLExporter(config=c, template_name='lab', exclude_anchor_links=True, exclude_input_prompt=True,
                           exclude_output_prompt=True).from_notebook_node(nb)
    style = '\n'.join(re.findall(r'<style[^>]*>.*?</style>', body, flags=re.S))
    style = re.sub(r'/\*.*?\*/\s*', '', style, flags=re.S)  # JupyterLab's CSS comments (credits, notes on prompts)
    m = re.search(r'<body[^>]*>(.*)</body>', body, flags=re.S)
    return style + (m.group(1) if m else body)

def title_of(path:Path) -> str:
    "A notebook's H1, as the sidebar names it."
    for c in json.loads(path.read_text())['cells']:
        if c['cell_type'] == 'markdown':
            m = re.match(r'#\s+(.+)', ''.join(c['source']).strip())
            if m: return m.group(1).strip()
    return path.stem

_ONE_AT_A_TIME = threading.Lock()

def build_page(rel:Path, out:Path, all_pages:list, titles:dict, nav:list, nbs:Path=NBS, site:str='flowgrpo_nb',
               source_links:bool=False) -> Path:
    """Execute, process and write one page; its path. Pages run in parallel in their kernels; nbdev's processing, which
    imports and runs the notebook's `show_doc` cells in this process, one page at a time (imports are not
    thread-safe: diffusers' lazy modules fail half-imported)."""
    nb = execute(nbs/rel)
    with _ONE_AT_A_TIME:
        title, desc, nb = process(nb, nbs/rel)
        body = notebook_body(render_outputs(tag_cells(nb)))
    dest = out/rel.with_suffix('.html')
    dest.parent.mkdir(parents=True, exist_ok=True)
    from flowgrpo_nb.checkpoint import write_text
    write_text(dest, page_html(rel, title or titles.get(rel, ''), desc, body, all_pages, titles, nav, site,
                               source_links), 'a page')
    return dest

# ---------------------------------------------------------------------------------------------- 6. every link

URL_ATTR = re.compile(r'''\s(?:href|src|action|poster|data)\s*=\s*(["'])(.*?)\1''', re.S)

def broken_links(out:Path, nbs:Path=NBS) -> list[tuple[str, str, str]]:
    """Every internal link (href, src, ..., anchors included) of the pages built in `out` that does not resolve:
    (page, link, why). A link to a page of the site that this build left out (`--only`) counts as resolved."""
    site = {p.with_suffix('.html').as_posix() for p in pages(nbs)}
    built = sorted(out.rglob('*.html'))
    ids = {p.resolve(): {html.unescape(i) for i in IDS.findall(p.read_text())} for p in built}
    bad = []
    for page in built:
        code = re.sub(r'<pre\b.*?</pre>', '', page.read_text(), flags=re.S)  # a code listing's `src="..."` is text
        for _, url in URL_ATTR.findall(code):
            url = html.unescape(url)
            if url.startswith(('data:', 'javascript:', 'mailto:')) or OTHER_HOST.match(url): continue
            path, _, anchor = url.partition('#')
            dest, why = (page.parent/path).resolve() if path else page.resolve(), None
            if dest in ids: why = None if not anchor or anchor in ids[dest] else f'no id {anchor!r} there'
            elif not dest.exists():
                try: inside = dest.relative_to(out.resolve()).as_posix() in site
                except ValueError: inside = False
                why = None if inside and path.endswith('.html') else 'no such file'
            if why: bad.append((page.relative_to(out).as_posix(), url, why))
    return bad

# ---------------------------------------------------------------------------------------------- 7. the record, the plan

def _cpu() -> str:
    "This machine's CPU as the records name it: its model and torch's kernel capability (e.g. 'AMD EPYC (AVX2)')."
    import torch
    from flowgrpo_nb.precision import cpu_name
    return f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()})"

RECORD = 'build.json'                              # in the site's folder: each page's seconds and content hash
COMMITTED = ROOT/'results'/'docs'/'build.json'     # a whole build's record on this machine (`--record`)

def site_digest(all_pages:list, titles:dict, source_links:bool=False) -> str:
    """The hash of what every page is built from besides its notebook: the package's sources, this script, the site's
    pages and titles, the options."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for f in sorted((ROOT/'flowgrpo_nb').rglob('*.py')):
        h.update(f.relative_to(ROOT).as_posix().encode() + f.read_bytes())
    h.update(json.dumps([[p.as_posix(), titles.get(p, '')] for p in all_pages] + [source_links]).encode())
    return h.hexdigest()

def page_key(path:Path, site:str) -> str:
    "A page's content hash: its notebook's bytes and the site's digest."
    return hashlib.sha256(path.read_bytes() + site.encode()).hexdigest()

def read_record(f:Path) -> dict:
    "A build record (`{'pages': {notebook: {'key', 'seconds'}}, ...}`); empty where it is missing or unreadable."
    try: rec = json.loads(Path(f).read_text())
    except (OSError, ValueError): return {'pages': {}}
    return rec if isinstance(rec, dict) and isinstance(rec.get('pages'), dict) else {'pages': {}}

def estimate(todo:list, records:list, jobs:int) -> float|None:
    """Wall seconds the pages in `todo` take: each page's time in the first record that has it (a page none has: the
    median of those known), spread over `jobs` workers; None when no record has a time."""
    known = {}
    for rec in reversed(records): known |= {p: v['seconds'] for p, v in rec['pages'].items() if 'seconds' in v}
    if not known: return None
    mid = sorted(known.values())[len(known) // 2]
    return sum(known.get(p.as_posix(), mid) for p in todo) / max(1, min(jobs, len(todo)))

def _minutes(s:float) -> str: return f'{s:.0f} s' if s < 90 else f'{s / 60:.0f} min'

def _page_job(p:Path, *args) -> tuple:
    "One page in a worker: (notebook, page, seconds, None) or, where a cell failed, (notebook, None, 0, message)."
    t = time.perf_counter()
    try: return p, build_page(p, *args), time.perf_counter() - t, None
    except Exception as e:
        if type(e).__name__ not in ('CellExecutionError', 'CellTimeoutError', 'DeadKernelError'): raise
        return p, None, 0.0, f"{p}: a cell failed while its page was built:\n{e}"

def _machine() -> str:
    from flowgrpo_nb.precision import machine_key
    k = machine_key()
    return f"{k.get('cpu', '?')} ({k.get('capability', '?')}), {os.cpu_count()} CPUs, torch {k.get('torch', '?')}"

def build(out:Path, only:list|None=None, nbs:Path=NBS, log=None, progress:bool=False, source_links:bool=False,
          jobs:int=1, force:bool=False, say=None) -> list[Path]:
    """The static site in `out` (every page, or those in `only`); its pages. `progress`: a progress bar, one step per
    page; `say`: called with the plan (pages, workers, estimate) before the work; `log`: with a line per page built;
    `jobs`: pages built at once; `force`: build pages whose content hash is unchanged too; `source_links`: keep the
    links to the code host."""
    from tqdm.auto import tqdm
    from flowgrpo_nb.checkpoint import write_json
    out.mkdir(parents=True, exist_ok=True)
    import plotly
    shutil.copy(Path(plotly.__file__).parent/'package_data'/'plotly.min.js', out/'plotly.min.js')
    all_pages, nav = pages(nbs), navbar(nbs)
    titles, site = {p: title_of(nbs/p) for p in all_pages}, site_name(nbs)
    todo = [Path(p) for p in only] if only else all_pages
    unknown = [str(p) for p in todo if p not in all_pages]
    if unknown:
        raise SystemExit(f"{' '.join(unknown)}: not a notebook of the site; allowed: "
                         f"{' '.join(map(str, all_pages))}")
    rec, digest, t0 = read_record(out/RECORD), site_digest(all_pages, titles, source_links), time.perf_counter()
    keys = {p: page_key(nbs/p, digest) for p in todo}
    kept = [p for p in todo if not force and (out/p.with_suffix('.html')).exists()
            and rec['pages'].get(p.as_posix(), {}).get('key') == keys[p]]
    run = [p for p in todo if p not in kept]
    jobs = max(1, min(jobs, len(run) or 1))
    est = estimate(run, [rec, read_record(COMMITTED)], jobs)
    if say and not run: say(f"nothing to build: the {len(kept)} page(s) asked for are unchanged since the last build "
                            "(--force builds them again)")
    elif say: say(f"building {len(run)} of the site's {len(all_pages)} pages"
                + (f" ({len(kept)} unchanged since the last build: kept)" if kept else '')
                + f" with {jobs} worker(s); "
                + (f"estimated {_minutes(est)} from the pages' last times" if est is not None else
                   "no page timed yet: no estimate"))
    written, failed = [], []
    rec['cpu'] = _cpu()  # the machine its seconds were measured on
    bar = tqdm(total=len(run), desc='pages', unit='page', disable=not progress, dynamic_ncols=True)
    def done(p, dest, secs, err):
        bar.set_postfix_str(str(p), refresh=False); bar.update()
        if err: failed.append(err); return  # the other pages go on; the build fails at its end
        written.append(dest)
        rec['pages'][p.as_posix()] = dict(key=keys[p], seconds=round(secs, 1))
        write_json(out/RECORD, rec, 'the build record')  # after every page: a stopped build keeps what it finished
        if log: log(f"  {p} ({secs:.0f} s)")
    args = (out, all_pages, titles, nav, nbs, site, source_links)
    if jobs == 1:
        for p in run: done(*_page_job(p, *args))
    else:
        # threads suffice: a page's work is its kernel's, a process of its own (one thread: OMP_NUM_THREADS)
        os.environ['OMP_NUM_THREADS'] = '1'
        with ThreadPoolExecutor(jobs) as ex:
            futures = [ex.submit(_page_job, p, *args) for p in run]
            try:
                for f in as_completed(futures): done(*f.result())
            except BaseException:
                for f in futures: f.cancel()
                raise
    bar.close()
    if failed: raise SystemExit('\n'.join(failed))
    site_pages = written + [out/p.with_suffix('.html') for p in kept]
    check_anchors(out, site_pages)
    rec['last'] = dict(built=len(run), kept=len(kept), jobs=jobs, seconds=round(time.perf_counter() - t0, 1),
                       machine=_machine(), when=time.strftime('%Y-%m-%d %H:%M'))
    write_json(out/RECORD, rec, 'the build record')
    return site_pages

def as_page(name:str, nbs:Path=NBS) -> Path:
    "A notebook named as a user would (`nbs/05_credit.ipynb`, `05_credit.ipynb`, an absolute path) as a site page."
    p = (Path.cwd()/name).resolve()
    return p.relative_to(nbs.resolve()) if p.is_file() and p.is_relative_to(nbs.resolve()) else Path(name)

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('notebooks', nargs='*', help='build only these pages, e.g. nbs/05_credit.ipynb')
    ap.add_argument('--out', default=str(ROOT/'_docs'), help='folder of the site (default: _docs)')
    ap.add_argument('--only', nargs='+', default=[],
                    help='build only these notebooks, e.g. tutorials/quickstart.ipynb 07_viz.ipynb')
    ap.add_argument('--jobs', type=int, default=min(4, os.cpu_count() or 1),
                    help='pages built at once, one single-thread worker each (default: the CPUs, at most 4)')
    ap.add_argument('--force', action='store_true', help='build pages whose content hash is unchanged too')
    ap.add_argument('--record', help='where a whole build copies its record (e.g. results/docs/build.json)')
    ap.add_argument('--quarto', action='store_true',
                    help='use Quarto (nbdev-docs); the default where quarto is installed')
    ap.add_argument('--source-links', action='store_true',
                    help="keep show_doc's 'source' links to the code host (off: the pages are for reading offline)")
    a = ap.parse_args(argv)
    if a.jobs < 1: ap.error(f'--jobs {a.jobs}: at least 1')
    if a.quarto or shutil.which('quarto'):
        return subprocess.run([str(Path(sys.executable).parent/'nbdev-docs')], cwd=ROOT, check=True)
    t = time.perf_counter()
    print(f"building the site without Quarto into {a.out}")
    only = [as_page(n) for n in [*a.notebooks, *a.only]] or None
    written = build(Path(a.out), only, progress=True, source_links=a.source_links, jobs=a.jobs, force=a.force,
                    say=lambda s: print(s, flush=True))
    print(f"{len(written)} pages in {time.perf_counter() - t:.0f} s: open {Path(a.out)/'index.html'}")
    bad = broken_links(Path(a.out))
    if bad: print(f"{len(bad)} internal link(s) lead nowhere:\n" + '\n'.join(f"  {p}: {u} ({w})" for p, u, w in bad))
    if a.record:
        rec = read_record(Path(a.out)/RECORD)
        if only or set(rec['pages']) != {p.as_posix() for p in pages()}:
            raise SystemExit(f"--record {a.record}: only a whole build is recorded (this one built some pages)")
        from flowgrpo_nb.checkpoint import write_json
        write_json(Path(a.record), rec, 'the build record')
        print(f"recorded in {a.record}")

if __name__ == '__main__': main()
