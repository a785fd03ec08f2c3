"""Faults: fuzzed catalogue files. The evaluation readers (st5_jax/evaluation/readers.py) and the
raw-file builders (st5_jax/data/builders.py) meet one file of a data folder replaced by fuzzed
bytes (NUL, BOM, CR/CRLF, unterminated quotes, 100 kB lines, invalid UTF-8, truncation, wrong
column counts). Never an unhandled exception:

- evaluation readers never read a benchmark partially: they return one row per line (rows
  accounted for) or raise `BadRowError` as `file:line: reason` (a ValueError naming the file for
  a file-level mismatch);
- builders count every row: read = examples + filtered + skipped, skipped rows reported as
  `file:line: reason`, or an `InputFileError` naming the file.

The folder is written in tmp_path (small valid files in the catalogue's layout, nothing copied
from the shared data).
"""

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from st5_jax.data import builders
from st5_jax.data.rows import RowStats
from st5_jax.errors import BadRowError, InputFileError
from st5_jax.evaluation import readers

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_NASTY = st.sampled_from([b"", b"\x00\x00", b"\xef\xbb\xbf", b"\xff\xfe", b"\r", b"\t\t\t\t", b'"', b'"a,"b"',
                          b'{"q": ', b"[1, 2]", b"null", b"\xe9t\xe9", b"a\tb", b"a\tb\tc\td\te\tf\tg\th\ti\tj\tk",
                          b"x" * 100_000, b'"unterminated\n,quote', b"nan", b"1e999", b"DESC", b"DESC:manner",
                          b"<Question>", b"</root>", b"5\tx", b"entailment", b"ENTAILMENT", b"\xc3\xa9\t\xe2\x80\xa8"])
_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40).map(lambda s: s.encode("utf-8", "surrogatepass"))
_LINE = st.one_of(_NASTY, _TEXT, st.binary(max_size=40))


@st.composite
def _fuzzed(draw, good, header=None):
  """A file: valid lines mixed with bad ones, LF or CRLF, maybe a BOM, maybe truncated."""
  good = st.sampled_from(good)
  lines = draw(st.lists(st.one_of(good, good, _LINE), max_size=20))
  if header is not None and draw(st.booleans()):
    lines = [header, *lines]
  data = (b"\r\n" if draw(st.booleans()) else b"\n").join(lines)
  if draw(st.booleans()):
    data += b"\n"
  if draw(st.booleans()):
    data = b"\xef\xbb\xbf" + data
  if data and draw(st.booleans()):
    data = data[:draw(st.integers(0, len(data)))]
  return data


def _n_lines(data: bytes, *, bom_dropped: bool) -> int:
  if bom_dropped and data.startswith(b"\xef\xbb\xbf"):
    data = data[3:]
  return 0 if not data else data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _write(root, files):
  for rel, data in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
  return root


def _read_or_clear_error(fn, path):
  """fn()'s result, or None after checking the error is one of the clear ones and names `path`."""
  try:
    return fn()
  except BadRowError as e:  # also a ValueError: check it first, it must say where
    assert re.match(rf"{re.escape(str(path))}:\d+: \S", str(e)), e
  except ValueError as e:
    assert str(path) in str(e), e
  return None


# ------------------------------------------------------------------ evaluation readers

# reader name -> (fuzzed file, valid lines, header or None, call(data_dir), BOM dropped by the reader,
#                 other files of the folder that the reader needs)
_STSB = b"main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane is taking off.\tAn air plane is taking off."
_GLUE_STSB_HEADER = b"index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
READERS = {
    "stsb": ("stsb/original/sts-dev.csv", [_STSB, _STSB.replace(b"5.000", b"0.5")], None,
             lambda d: readers.read_stsb(d, split="dev"), True, {}),
    "sick": ("sick/brmson_semeval2014/SICK_trial.txt", [b"4\tThe boys play\tNo boy plays\t3.6\tCONTRADICTION"],
             b"pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment",
             lambda d: readers.read_sick(d, split="trial"), True, {}),
    "binary": ("senteval_transfer/MR/rt-polarity.pos", [b"a fine film .", b"", b"\xc3\xa9t\xc3\xa9 !"], None,
               lambda d: readers.read_binary(d, task="MR"), False,
               {"senteval_transfer/MR/rt-polarity.neg": b"dull .\nbad .\n"}),
    "sst2": ("senteval_transfer/SST/binary/sentiment-dev", [b"a fine film .\t1", b"dull .\t0"], None,
             lambda d: readers.read_sst2(d, split="dev"), True, {}),
    "trec": ("senteval_transfer/TREC/TREC_10.label", [b"DESC:manner How did serfdom develop ?",
                                                     b"NUM:date When was it ?"], None,
             lambda d: readers.read_trec(d, split="test"), False, {}),
    "mrpc": ("senteval_transfer/MRPC/msr_paraphrase_test.txt", [b"1\t1089874\t1089925\tA b .\tC d ."],
             b"Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", lambda d: readers.read_mrpc(d, split="test"), True, {}),
    "glue_cola": ("glue/CoLA/dev.tsv", [b"gj04\t1\t\tThe sailors rode the breeze .", b"gj04\t0\t*\tRode ."], None,
                  lambda d: readers.read_glue(d, task="CoLA", split="dev"), True, {}),
    "glue_sst2": ("glue/SST-2/dev.tsv", [b"a fine film . \t1"], b"sentence\tlabel",
                  lambda d: readers.read_glue(d, task="SST-2", split="dev"), True, {}),
    "glue_mrpc": ("glue/MRPC/dev.tsv", [b"1\t1\t2\tA b .\tC d ."], b"Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                  lambda d: readers.read_glue(d, task="MRPC", split="dev"), True, {}),
    "glue_stsb": ("glue/STS-B/dev.tsv", [b"0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA .\tB .\t5.000"],
                  _GLUE_STSB_HEADER, lambda d: readers.read_glue(d, task="STS-B", split="dev"), True, {}),
    "glue_rte": ("glue/RTE/dev.tsv", [b"0\tA man .\tA person .\tentailment", b"1\tA .\tB .\tnot_entailment"],
                 b"index\tsentence1\tsentence2\tlabel", lambda d: readers.read_glue(d, task="RTE", split="dev"),
                 True, {}),
}
_HAS_HEADER = {"sick", "mrpc", "glue_sst2", "glue_mrpc", "glue_stsb", "glue_rte"}


@pytest.mark.parametrize("name", sorted(READERS))
@SETTINGS
@given(data=st.data())
def test_evaluation_reader(tmp_path_factory, name, data):
  rel, good, header, call, bom_dropped, others = READERS[name]
  fuzzed = data.draw(_fuzzed(good, header))
  root = _write(tmp_path_factory.mktemp(name), {**others, rel: fuzzed})
  got = _read_or_clear_error(lambda: call(root), root / rel)
  if got is None:
    return
  n = _n_lines(fuzzed, bom_dropped=bom_dropped) - (name in _HAS_HEADER)
  if name == "binary":
    n += 2  # the two valid negatives
  assert len(got) == max(n, 0), (len(got), n)  # every line is a row: none lost, none doubled
  texts = [*(getattr(got, "texts", None) or []), *(getattr(got, "sents1", None) or []),
           *(getattr(got, "sents2", None) or [])]
  assert all(isinstance(t, str) and t for t in texts)


_STS16 = readers.STS_SUBSETS[2016]


@pytest.mark.parametrize("which", ["gs", "input"])
@SETTINGS
@given(data=st.data())
def test_sts_reader(tmp_path_factory, which, data):
  """STS 2016 (original layout): a fuzzed gold or input file of one subset, the others valid."""
  folder = "sts12-16/original/STS16-en-test"
  files = {}
  for subset in _STS16:
    files[f"{folder}/STS2016.input.{subset}.txt"] = b"A cat sits .\tA cat sat .\tsrc1\tsrc2\nHi .\tHello .\ts\ts\n"
    files[f"{folder}/STS2016.gs.{subset}.txt"] = b"4.2\n\n"  # a blank gold line: an unscored pair, dropped
  rel = f"{folder}/STS2016.{which}.{_STS16[0]}.txt"
  if which == "gs":
    fuzzed = data.draw(_fuzzed([b"3.5", b"0", b"", b" "]))
    n = _n_lines(fuzzed, bom_dropped=False)
    files[rel.replace(".gs.", ".input.")] = b"A .\tB .\n" * n
  else:
    fuzzed = data.draw(_fuzzed([b"A .\tB .", b"A .\tB .\tx\ty"]))
    n = _n_lines(fuzzed, bom_dropped=False)
    files[rel.replace(".input.", ".gs.")] = b"1.0\n" * n
  files[rel] = fuzzed
  root = _write(tmp_path_factory.mktemp("sts"), files)
  got = _read_or_clear_error(lambda: readers.read_sts(root, year=2016), root / rel)
  if got is None:
    return
  if which == "gs":
    scored = sum(1 for line in fuzzed.decode("utf-8").split("\n")[:n] if line.strip())
  else:
    scored = n
  assert len(got) == scored + len(_STS16) - 1, (len(got), scored)
  assert sum(1 for s in got.subsets if s == _STS16[0]) == scored


# ------------------------------------------------------------------ raw-file builders


def _check_accounting(stats: RowStats, n_examples: int, path) -> None:
  assert stats.rows_read == n_examples + stats.rows_filtered + stats.rows_skipped, stats
  assert len(stats.first_skipped) == min(stats.rows_skipped, stats.max_reported)
  # SentEval's parallel s1/s2/labels files: a pair is reported at its line of s1.<split>.
  where = path.parent / ("s1" + path.suffix) if path.parent.name == "snli_senteval_devtest" else path
  for report in stats.first_skipped:
    assert report.startswith(f"{where}:") and re.match(r".*?:[^ ]+: \S", report), report


def _run_builder(fn, path):
  stats = RowStats()
  try:
    examples = fn(stats)
  except InputFileError as e:  # a clear file-level error (no rows, bad header, not JSON/XML, empty)
    assert str(path) in str(e), e
    return None
  _check_accounting(stats, len(examples), path)
  for ex in examples:  # dicts from builders, (premise, hypothesis, label, where) from NLI readers
    assert all(isinstance(v, str) and v for v in (ex.values() if isinstance(ex, dict) else ex)), ex
  return examples


_TRECQA = [b'What is it ?,1,"It is a thing ."', b"Who ?,0,Nobody .", b'"Where, then ?",1,There .']
_WIKIQA_HEADER = b"QuestionID\tQuestion\tDocumentID\tDocumentTitle\tSentenceID\tSentence\tLabel"
_WIKIQA = [b"Q0\tHow ?\tD0\tTitle\tD0-0\tLike this .\t1", b"Q1\tWhy ?\tD1\tT\tD1-0\tNo .\t0",
           b"Q2\tWho\tT\tSomeone .\t1"]
_CQA16 = [b"Good Bank,Which bank is good,Hi; which is the best bank ?,PerfectMatch",
          b'x,"""Where to eat""",Any place ?,Irrelevant', b"s,q,r,Relevant"]
_CQA15 = [b'<Question QID="Q1" QCATEGORY="x"><QSubject>Oil baths</QSubject><QBody>Any spa ?</QBody>',
          b'<Comment CID="Q1_C1" CGOLD="Good"><CBody>Try the Ritz .</CBody></Comment>',
          b'<Comment CID="Q1_C2" CGOLD="Bad"><CBody>No idea</CBody></Comment>', b"</Question>"]
_CQA15_VALID = b"<root>\n" + b"\n".join(_CQA15) + b"\n</root>\n"
_SIMCSE = [b"Two women embrace .,Two women hug .,The men fight .,dev", b'"A, b",c,d,test', b"x,y,z,train"]
_NLI_S1 = [b"A man sleeps .", b"Two dogs run ."]
_NLI_LABELS = [b"entailment", b"contradiction", b"neutral", b"-"]
_SICK_HEADER = b"pair_ID\tsentence_A\tsentence_B\tentailment_judgment"


def _trecqa(root, stats):
  return builders.build_trecqa(root, stats=stats).examples


BUILDERS = {
    # name -> (fuzzed file, valid lines, header, other files, build(root, stats) -> examples)
    "trecqa": (builders.TRECQA_FILES[1], _TRECQA, b"qtext,label,atext",
               {f: b"qtext,label,atext\n" + _TRECQA[0] + b"\n" for f in builders.TRECQA_FILES}, _trecqa),
    # The train file (the builder's only one now: test is evaluation-only) has both layouts, as fuzzed here.
    "wikiqa": (builders.WIKIQA_FILES[0], _WIKIQA, _WIKIQA_HEADER,
               {f: _WIKIQA_HEADER + b"\n" + _WIKIQA[0] + b"\n" for f in builders.WIKIQA_FILES},
               lambda root, stats: builders.build_wikiqa(root, stats=stats).examples),
    "cqa2016": (builders.CQA2016_MATCH_FILES[0], _CQA16, b"feature,question,rel_question,labels",
                {f: b"feature,question,rel_question,labels\n" + _CQA16[0] + b"\n"
                 for f in builders.CQA2016_MATCH_FILES},
                lambda root, stats: builders.build_qatar_living_perfect_match(root, stats=stats).examples),
    "cqa2015_xml": (builders.CQA2015_FILES[0], [*_CQA15, b"<root>", b"</root>"], None,
                    {**{f: _CQA15_VALID for f in builders.CQA2015_FILES},
                     **{f: b"feature,question,answer,labels\nS,Q ?,A .,Good\n" for f in builders.CQA2016_GOOD_FILES}},
                    lambda root, stats: builders.build_qatar_living_good(root, stats=stats).examples),
    "snli_triples_csv": (builders.SNLI_TRIPLES_FILE, _SIMCSE, b"sent0,sent1,hard_neg,split", {},
                         lambda root, stats: builders.build_shipped_triples(root, "dev", stats=stats).examples),
    "snli_senteval_labels": (f"{builders.SNLI_SENTEVAL_DIR}/labels.dev", _NLI_LABELS, None, {},
                             lambda root, stats: list(builders.iter_nli_file(
                                 str(root / builders.SNLI_SENTEVAL_DIR / "s1.dev"), stats=stats))),
    "snli_senteval_s1": (f"{builders.SNLI_SENTEVAL_DIR}/s1.dev", _NLI_S1, None, {},
                         lambda root, stats: list(builders.iter_nli_file(
                             str(root / builders.SNLI_SENTEVAL_DIR / "s1.dev"), stats=stats))),
    "sick_nli": ("sick/brmson_semeval2014/SICK_trial.txt", [b"1\tA .\tB .\tENTAILMENT", b"2\tC .\tD .\tNEUTRAL"],
                 _SICK_HEADER, {},
                 lambda root, stats: list(builders.iter_nli_file(
                     str(root / "sick/brmson_semeval2014/SICK_trial.txt"), stats=stats))),
    "snli_jsonl": ("nli/snli_1.0_dev.jsonl", [b'{"sentence1": "A .", "sentence2": "B .", "gold_label": "entailment"}',
                                              b'{"sentence1": "A .", "sentence2": "C .", "gold_label": "-"}',
                                              b'{"sentence1": 5, "sentence2": ["x"], "gold_label": null}'], None, {},
                   lambda root, stats: list(builders.iter_nli_file(str(root / "nli/snli_1.0_dev.jsonl"),
                                                                   stats=stats))),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
@SETTINGS
@given(data=st.data())
def test_builder(tmp_path_factory, name, data):
  rel, good, header, others, build = BUILDERS[name]
  fuzzed = data.draw(_fuzzed(good, header))
  files = dict(others)
  if name.startswith("snli_senteval"):  # parallel s1/s2/labels files of the fuzzed one's line count
    n = _n_lines(fuzzed, bom_dropped=False)
    for part in ("s1", "s2", "labels"):
      files[f"{builders.SNLI_SENTEVAL_DIR}/{part}.dev"] = (b"entailment\n" if part == "labels" else b"A .\n") * n
  files[rel] = fuzzed
  root = _write(tmp_path_factory.mktemp(name), files)
  _run_builder(lambda stats: build(root, stats), root / rel)


def _squad(value):
  return json.dumps({"version": "1.1", "data": value}).encode()


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                     lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children,
                                                                                       max_size=3), max_leaves=10)
_QA = st.fixed_dictionaries({"id": st.one_of(st.text(max_size=5), _JSON), "question": st.one_of(st.just("Who ?"), _JSON),
                             "answers": st.one_of(st.just([{"answer_start": 0, "text": "Bob"}]), _JSON,
                                                  st.lists(st.fixed_dictionaries({"answer_start": _JSON,
                                                                                  "text": _JSON}), max_size=2))})
_PARAGRAPH = st.fixed_dictionaries({"context": st.one_of(st.just("Bob ran. He won."), _JSON),
                                    "qas": st.one_of(st.lists(_QA, max_size=3), _JSON)})
_ARTICLE = st.fixed_dictionaries({"title": st.one_of(st.just("T"), _JSON),
                                  "paragraphs": st.one_of(st.lists(_PARAGRAPH, max_size=3), _JSON)})


@SETTINGS
@given(data=st.data())
def test_squad_builder(tmp_path_factory, data):
  """SQuAD JSON: arbitrary bytes, and valid JSON with any value in any field."""
  fuzzed = data.draw(st.one_of(_fuzzed([b'{"data": []}', b"{", b"}"]),
                               st.lists(_ARTICLE, max_size=3).map(_squad), _JSON.map(_squad)))
  rel = builders.SQUAD_TRAIN_FILES[0]
  root = _write(tmp_path_factory.mktemp("squad"), {rel: fuzzed})
  _run_builder(lambda stats: builders.build_reqa_squad(root, stats=stats).examples, root / rel)
