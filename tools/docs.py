"""Build the docs site: `python tools/docs.py [--out DIR] [--only NB ...] [--quarto]`.

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
   numbered notebooks, then each folder as a section), and links to notebooks point to their pages.

Nothing is fetched: the pages open from disk, offline (`_docs/index.html`). `--only` builds some pages (the others
still appear in the navigation), which is what the test does."""
import argparse, html, json, os, re, shutil, subprocess, sys, time, warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'
PLOTLY_MIME = 'application/vnd.plotly.v1+json'
WIDGET_VIEW = 'application/vnd.jupyter.widget-view+json'
WIDGET_STATE = 'application/vnd.jupyter.widget-state+json'

def pages(nbs:Path=NBS) -> list[Path]:
    "The notebooks of the site in the sidebar's order (nbdev's): index first, then files, then each folder's (paths relative to `nbs`)."
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
    "The notebook at `path` executed in a kernel (cwd: its folder), widget state stored; cells nbdev-test skips are not run."
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    for i in range(tries):
        try: return _execute(path, timeout)
        except (CellTimeoutError, DeadKernelError):  # a kernel that stalls (seen now and then on a loaded machine): once more
            if i == tries - 1: raise

def _execute(path:Path, timeout:int):
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    keep = run_cells(path)
    skipped = {}
    for c in nb.cells:
        if c.cell_type == 'code' and c.id not in keep: skipped[c.id], c.source = c.source, ''
    NotebookClient(nb, timeout=timeout, kernel_name='python3', store_widget_state=True, allow_errors=False,
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
        warnings.simplefilter('ignore')  # nbdev's advice on cells mixing imports and code is for authors, not for a build
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
    "Quarto's cell options as nbconvert tags: `echo: false` hides the code, `output: false` the outputs, `include: false` both."
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
    "A plotly figure's JSON as HTML drawn with the page's plotly.js, as wide as its container unless the figure fixes a width."
    import plotly.io as pio
    return pio.to_html(fig, include_plotlyjs=False, include_mathjax=False, full_html=False, default_width='100%',
                       config={'responsive': True, 'displaylogo': False}, validate=False)

def output_html(o:dict, state:dict) -> str:
    "One output (of a cell or of an Output widget) as HTML."
    if o.get('output_type') == 'stream': return f"<pre class='stream'>{html.escape(''.join(o.get('text', '')))}</pre>"
    if o.get('output_type') == 'error': return f"<pre class='error'>{html.escape(o.get('ename', ''))}: {html.escape(o.get('evalue', ''))}</pre>"
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
    "A widget drawn from its stored state: boxes and tabs around their children, an Output's outputs, a control's value."
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
        heads = ''.join(f"<button class='w-tab-head{' on' * (i == sel)}' onclick='wTab(this, {i})'>{html.escape(str(h))}</button>"
                        for i, h in enumerate(titles))
        panels = ''.join(f"<div class='w-tab-panel' style='display:{'block' if i == sel else 'none'}'>{k}</div>" for i, k in enumerate(kids))
        return f"<div class='w-tab' id='w-tab-{t}'><div class='w-tab-heads'>{heads}</div>{panels}</div>"
    if kind in ('VBoxModel', 'HBoxModel', 'BoxModel', 'GridBoxModel'):
        return f"<div class='w-box {'w-hbox' if kind == 'HBoxModel' else 'w-vbox'}'>{''.join(kids)}</div>"
    if kind == 'OutputModel': return ''.join(output_html(o, state) for o in s.get('outputs', []))
    if kind in ('DropdownModel', 'SelectModel', 'RadioButtonsModel', 'ToggleButtonsModel'):
        labels, i = s.get('_options_labels', []), s.get('index')
        value = labels[i] if isinstance(i, int) and i < len(labels) else ''
        return f"<div class='w-control'><label>{label}</label> <span class='w-value'>{html.escape(str(value))}</span></div>"
    if 'value' in s and not isinstance(s['value'], (dict, list)):
        rng = f" ({s['min']}–{s['max']})" if 'min' in s and 'max' in s else ''
        if kind in ('HTMLModel', 'HTMLMathModel'): return f"<div>{s['value']}</div>"
        return f"<div class='w-control'><label>{label}</label> <span class='w-value'>{html.escape(str(s['value']))}</span>{rng}</div>"
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
nav.sidebar{flex:0 0 230px;padding:1em;font-size:.9em;position:sticky;top:0;max-height:100vh;overflow:auto;box-sizing:border-box}
nav.sidebar a{display:block;padding:.15em 0;color:#333;text-decoration:none} nav.sidebar a.on{font-weight:600;color:#2780e3}
nav.sidebar .section{margin-top:.8em;font-weight:600;color:#555}
main{flex:1 1 auto;min-width:0;max-width:1000px;padding:1em 2em;box-sizing:border-box}
main .description{font-size:1.1em;color:#555}
.jp-Cell,.jp-OutputArea-output{max-width:100%;overflow-x:auto}
.jp-InputPrompt,.jp-OutputPrompt,.jp-InputArea-prompt,.jp-OutputArea-prompt{display:none}
pre{background:#f7f7f7;padding:.5em;overflow-x:auto}
table{border-collapse:collapse} th,td{border:1px solid #ddd;padding:.2em .5em}
.w-hbox{display:flex;gap:1em;flex-wrap:wrap} .w-control{margin:.2em 0;color:#444} .w-control label{font-weight:600}
.w-tab-heads{border-bottom:1px solid #ccc;margin:.5em 0} .w-tab-head{border:1px solid #ccc;border-bottom:none;background:#f3f3f3;
padding:.3em .8em;cursor:pointer} .w-tab-head.on{background:#fff;font-weight:600}
"""

TAB_JS = """function wTab(b, i){const t=b.closest('.w-tab');
t.querySelectorAll(':scope>.w-tab-heads>.w-tab-head').forEach((h,j)=>h.classList.toggle('on',j===i));
t.querySelectorAll(':scope>.w-tab-panel').forEach((p,j)=>p.style.display=j===i?'block':'none');
window.dispatchEvent(new Event('resize'));}"""

def page_html(rel:Path, title:str, desc:str, body:str, all_pages:list, titles:dict, nav:list) -> str:
    "One page: the navbar, the sidebar, the title and the notebook's HTML; links between notebooks lead to pages."
    up = '../' * (len(rel.parts) - 1)
    href = lambda p: up + str(Path(p).with_suffix('.html'))
    side, section = [], None
    for p in all_pages:
        if len(p.parts) > 1 and p.parts[0] != section:
            section = p.parts[0]; side.append(f"<div class='section'>{html.escape(section)}</div>")
        side.append(f"<a href='{href(p)}' class='{'on' if p == rel else ''}'>{html.escape(titles.get(p) or p.stem)}</a>")
    top = ''.join(f"<a href='{href(h)}'>{html.escape(t)}</a>" for t, h in nav)
    body = re.sub(r'''(href=["'])(?!https?:|#|mailto:)([^"'#]+?)\.ipynb(#[^"']*)?(["'])''', r'\1\2.html\3\4', body)
    body = re.sub(r'\{target="_blank"[^}]*\}', '', body)  # Quarto's link attributes in show_doc's markdown
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{html.escape(title or rel.stem)} – flowgrpo_nb</title><script src='{up}plotly.min.js'></script>"
            f"<style>{CSS}</style><script>{TAB_JS}</script></head><body>"
            f"<header><a class='site' href='{href('index.ipynb')}'>flowgrpo_nb</a>{top}</header><div class='layout'>"
            f"<nav class='sidebar'>{''.join(side)}</nav><main><h1>{html.escape(title)}</h1>"
            + (f"<p class='description'>{html.escape(desc)}</p>" if desc else '') + f"{body}</main></div></body></html>")

def notebook_body(nb) -> str:
    "The notebook's cells as HTML (nbconvert, lab styles, no page wrapper)."
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    c = Config()
    c.TagRemovePreprocessor.enabled = True
    c.TagRemovePreprocessor.remove_input_tags = {'remove_input'}
    c.TagRemovePreprocessor.remove_all_outputs_tags = {'remove_output'}
    c.TagRemovePreprocessor.remove_cell_tags = {'remove_cell'}
    body, _ = HTMLExporter(config=c, template_name='lab', exclude_anchor_links=True).from_notebook_node(nb)
    style = '\n'.join(re.findall(r'<style[^>]*>.*?</style>', body, flags=re.S))
    m = re.search(r'<body[^>]*>(.*)</body>', body, flags=re.S)
    return style + (m.group(1) if m else body)

def title_of(path:Path) -> str:
    "A notebook's H1, as the sidebar names it."
    for c in json.loads(path.read_text())['cells']:
        if c['cell_type'] == 'markdown':
            m = re.match(r'#\s+(.+)', ''.join(c['source']).strip())
            if m: return m.group(1).strip()
    return path.stem

def build_page(rel:Path, out:Path, all_pages:list, titles:dict, nav:list, nbs:Path=NBS) -> Path:
    "Execute, process and write one page; its path."
    title, desc, nb = process(execute(nbs/rel), nbs/rel)
    body = notebook_body(render_outputs(tag_cells(nb)))
    dest = out/rel.with_suffix('.html')
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(page_html(rel, title or titles.get(rel, ''), desc, body, all_pages, titles, nav))
    return dest

def build(out:Path, only:list|None=None, nbs:Path=NBS, log=print) -> list[Path]:
    "The static site in `out` (every page, or those in `only`); the pages written."
    out.mkdir(parents=True, exist_ok=True)
    import plotly
    shutil.copy(Path(plotly.__file__).parent/'package_data'/'plotly.min.js', out/'plotly.min.js')
    all_pages, nav = pages(nbs), navbar(nbs)
    titles = {p: title_of(nbs/p) for p in all_pages}
    todo = [Path(p) for p in only] if only else all_pages
    unknown = [str(p) for p in todo if p not in all_pages]
    if unknown: raise SystemExit(f"--only {' '.join(unknown)}: not a notebook of the site; allowed: {' '.join(map(str, all_pages))}")
    written = []
    for p in todo:
        t = time.perf_counter()
        try: written.append(build_page(p, out, all_pages, titles, nav, nbs))
        except Exception as e:
            if type(e).__name__ not in ('CellExecutionError', 'CellTimeoutError', 'DeadKernelError'): raise
            raise SystemExit(f"{p}: a cell failed while its page was built:\n{e}") from None
        log(f"  {p} ({time.perf_counter() - t:.0f} s)")
    return written

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', default=str(ROOT/'_docs'), help='folder of the site (default: _docs)')
    ap.add_argument('--only', nargs='+', help='build only these notebooks, e.g. tutorials/quickstart.ipynb 07_viz.ipynb')
    ap.add_argument('--quarto', action='store_true', help='use Quarto (nbdev-docs); the default where quarto is installed')
    a = ap.parse_args(argv)
    if a.quarto or shutil.which('quarto'):
        return subprocess.run([str(Path(sys.executable).parent/'nbdev-docs')], cwd=ROOT, check=True)
    t = time.perf_counter()
    print(f"building the site without Quarto into {a.out}")
    written = build(Path(a.out), a.only)
    print(f"{len(written)} pages in {time.perf_counter() - t:.0f} s: open {Path(a.out)/'index.html'}")

if __name__ == '__main__': main()
