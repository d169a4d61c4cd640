"""Every link of the docs' sources resolves: each relative link in a notebook's markdown (and in README.md) leads to a
file of the repository, and an anchor to a heading of the notebook it names (Quarto's ids, as the built site has).
Cheap where building the site is not (`tools/docs.py` runs every notebook): the built pages' links are checked on a
few pages by tests/test_docs.py."""
import importlib.util, json, re
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'
# [text](target) or [text](target "title"), and <a href="target">
LINK = re.compile(r'''\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)|<a\s[^>]*?href=["']([^"']+)["']''')

def _docs():
    spec = importlib.util.spec_from_file_location('docs', ROOT/'tools'/'docs.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod

def notebooks() -> list[Path]:
    hidden = lambda p: any(s.startswith(('_', '.')) for s in p.relative_to(NBS).parts)  # _proc, checkpoints
    return sorted(p for p in NBS.rglob('*.ipynb') if not hidden(p))

def markdown(path:Path) -> str:
    "A notebook's markdown cells, without code spans and fenced blocks (their brackets are code, not links)."
    if path.suffix != '.ipynb': text = path.read_text()
    else: text = '\n\n'.join(''.join(c['source']) for c in json.loads(path.read_text())['cells']
                             if c['cell_type'] == 'markdown')
    return re.sub(r'`[^`\n]*`', '', re.sub(r'```.*?```', '', text, flags=re.S))

def heading_ids(path:Path) -> set[str]:
    """The ids a notebook's page has: its headings' (Quarto's, as `tools/docs.py` gives them), explicit ones, and the
    headings `show_doc` writes for its functions and classes."""
    docs, nb = _docs(), json.loads(path.read_text())
    md = '\n\n'.join(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'markdown')
    md = re.sub(r'```.*?```', '', md, flags=re.S)
    text = lambda h: re.sub(r'[`*]|\[([^\]]*)\]\([^)]*\)', lambda m: m.group(1) or '', h)  # as rendered: no markup
    ids = {docs.slug(text(h)) for h in re.findall(r'^#{1,6}\s+(.*?)\s*(?:\{#[\w-]+\})?\s*$', md, flags=re.M)}
    ids |= set(re.findall(r'''\{#([\w-]+)\}''', md)) | set(re.findall(r'''\sid=["']([\w-]+)["']''', md))
    code = '\n'.join(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code')
    return ids | {docs.slug(n) for n in re.findall(r'^(?:def|class)\s+(\w+)|^@patch\s*\ndef\s+(\w+)', code, flags=re.M)
                  for n in ([n] if isinstance(n, str) else n) if n}

def links(path:Path) -> list[str]:
    return [a or b for a, b in LINK.findall(markdown(path))]

def _shown(p:Path) -> Path: return p.relative_to(ROOT) if ROOT in p.parents else p

def broken(path:Path) -> list[str]:
    "The relative links of `path` that lead nowhere: no such file, or no such heading in the notebook named."
    out = []
    for url in links(path):
        if re.match(r'^([a-z][a-z0-9+.-]*:|//)', url, re.I): continue  # another host, mailto:
        target, _, anchor = url.partition('#')
        dest = (path.parent/target).resolve() if target else path
        if not dest.exists(): out.append(f'{url}: no file {_shown(dest)}')
        elif anchor and dest.suffix == '.ipynb' and anchor not in heading_ids(dest):
            out.append(f'{url}: no heading #{anchor} in {_shown(dest)}')
    return out

def test_the_walk_sees_links():
    "The walk is not empty: the index links to notebooks of both wings, and the fixed `../../` links are found."
    pages = {l.partition('#')[0] for l in links(NBS/'index.ipynb')}
    assert {'tutorials/quickstart.ipynb', 'study/findings.ipynb'} <= pages, pages
    assert '../00_child_processes.ipynb' in links(NBS/'study'/'07_pool.ipynb')
    assert broken(NBS/'study'/'07_pool.ipynb') == []

def test_a_wrong_link_is_found(tmp_path):
    nb = tmp_path/'x.ipynb'
    nb.write_text(json.dumps(dict(cells=[dict(cell_type='markdown', source=[
        '# Title\n', '## A part\n', '[up](../../nowhere.ipynb), [here](#a-part), [there](#no-part), `[code](x)`'])])))
    assert [b.split(':')[0] for b in broken(nb)] == ['../../nowhere.ipynb', '#no-part']

@pytest.mark.parametrize('path', [ROOT/'README.md', *notebooks()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(path):
    assert broken(path) == []
