"""The public datasets the project knows: files, sha256 and where to get them.

Files are listed by their path inside the data folder (the layout `st5 data prepare
--out` writes), with the sha256 the datasets' DATA.md records. A dataset's files come
from one of three places:

* downloaded: each file has canonical URLs, tried in order: the dataset's own upstream
  location (an archive member is written `archive_url#member`) and then the public
  repository copy DATA.md names, which has exactly these bytes;
* derived: the dataset names its `Recipe`, the datasets it is made from and the function
  (st5_jax.data.offline.derive) that `st5 data prepare` runs on their verified files; the
  result must have the sha256 listed here, so a derived file is as checked as a download;
* local-only (no URL, no recipe): obtainable only from a local folder (--source) or a
  mirror (--base-url); `prepare` takes it when a copy is at hand and otherwise skips it,
  which is why no training task, and nothing the README's main job or `st5 eval`'s
  default suites read, may depend on one.

Extras (`optional`) are large files whose checksum is not known here.
"""

from __future__ import annotations

import dataclasses
import urllib.parse


@dataclasses.dataclass(frozen=True)
class RemoteFile:
  relpath: str
  sha256: str | None
  urls: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Recipe:
  """How `st5 data prepare` derives a dataset's files from other datasets' files."""
  name: str  # the function in st5_jax.data.offline.derive.RECIPES
  sources: tuple[str, ...]  # the datasets it reads (prepared first, checksummed as usual)
  command: str  # the same done by hand


@dataclasses.dataclass(frozen=True)
class Dataset:
  name: str
  description: str
  files: tuple[RemoteFile, ...]
  optional: bool = False
  note: str = ""
  derived: Recipe | None = None

  @property
  def local_only(self) -> bool:
    """Neither downloadable nor derivable: only a local folder or a mirror has it."""
    return self.derived is None and all(not f.urls for f in self.files)


def github(repo: str, commit: str, path: str) -> str:
  """github.com/<repo>/raw/<commit>/<path> (resolves abbreviated commits, unlike raw.githubusercontent)."""
  return f"https://github.com/{repo}/raw/{commit}/{urllib.parse.quote(path)}"


# sha256 of every file, copied from the development data's DATA.md.
CHECKSUMS: dict[str, dict[str, str]] = {
    "glue": {
        "glue/CoLA/dev.tsv": "2dc8ae5dafcf3a46fa4d4215cd4882c7d05c17e5a7696de4f9c32b29286a530c",
        "glue/CoLA/out_of_domain_dev.tsv": "a95f976e24a27e81d287f224bc07672813b703c3faa399bfdfada5b976854a11",
        "glue/CoLA/test.tsv": "3b4df85f7a9a0633574b38d181e18090ac961a24b18fb6bcd74999ddea8ad0b8",
        "glue/CoLA/train.tsv": "cb368ebeb9f27d7ad03720d27ddc95687a311bdb100781a2fe59a5f5b1bc0624",
        "glue/MRPC/dev.tsv": "9e8f284788040f7c9ecde2e1b3c07237c756f926bd9ef8548ef5d34b56f69f17",
        "glue/MRPC/test.tsv": "aee460ceda833926b8ab2ad952d399f5cf8bc9335cff19afcac03dc449558622",
        "glue/MRPC/train.tsv": "f178bcc72ab4c2c1c778b480912e0c8e1dba3ead150dc1d490d70682ab888c1e",
        "glue/QNLI/dev.tsv": "ac19409dcb04631eaaa094bdebdcf621086bc352503dfb6a1a648b614986f4fd",
        "glue/QNLI/test.tsv": "6d856264e292fa7a7bc7b8e182efa1454ffd9532733c12ad813017dd5b377a5a",
        "glue/RTE/dev.tsv": "80230dfa1347282e7b532b06a1004a76a710087541189bf874223ddf0e3819fb",
        "glue/RTE/test.tsv": "6e33f09b5c2bfd5fd5fde217070f3dd49e484e33b9752b5864cf36fc421a213f",
        "glue/RTE/train.tsv": "41e3a9b063433392343fad9e962cf2f58b681c78d8f71592f4186f0837246c5c",
        "glue/SST-2/dev.tsv": "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0",
        "glue/SST-2/test.tsv": "69a938605609b3e6663b4487918fe1565eb293734e6e520d0366d1d412fd2a13",
        "glue/SST-2/train.tsv": "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1",
        "glue/STS-B/LICENSE.txt": "3dfc3217395f8c5dd05c5f8995f25fe2f8fd258e6dd770b3de480749caee8c70",
        "glue/STS-B/dev.tsv": "fe7dc0632a5033562f3cadff991f6e8d9b9b6311861660e78c3c82eb7db67f59",
        "glue/STS-B/readme.txt": "e9488363d211c32ca5e912954f16eb9233cfed1b5b4b0475d0d812d35d7c8ef1",
        "glue/STS-B/test.tsv": "16b4223d7d44a644fbc10f1b449472cfe81e1715fb07cf44023b0aa88ce856eb",
        "glue/STS-B/train.tsv": "41c4d978b6162abdcada7e49a982211954cca5459c228db478af333124b257a2",
        "glue/WNLI/dev.tsv": "cba00490596dd14be8cf53b4f53bb744abe3a7b89f81ab210528d80225338ed5",
        "glue/WNLI/test.tsv": "ff0296817e235bf6f7a230c5f6781bd6ee228a45445f6510831fdef6f2a04766",
        "glue/WNLI/train.tsv": "9a88e9d54b6861cc796a088e9acf4f5f65064a9ef65ae6fa7a688b28391e5c9a",
        "glue/diagnostic/diagnostic.tsv": "0e13510b1bb14436ff7e2ee82338f0efb0133ecf2e73507a697dc210db3f05fd",
    },
    "snli_triples_derived": {
        "nli/snli_devtest_triples_derived.csv": "f166a30840177e9458ba9b9cc94eef040ff038301442181f56bcb50c4fc30121",
    },
    "snli_senteval": {
        "nli/snli_senteval_devtest/labels.dev": "d164d72435c3289fe53cb01e983f7c06e104bf192c0cae9caf2e99bf2e15f974",
        "nli/snli_senteval_devtest/labels.test": "e25c363e5cc70d5494d6e6555d8053eced22dca836e0f03067530eaad3d4f5f5",
        "nli/snli_senteval_devtest/s1.dev": "28a398b5478b10b4b851d4bb5b2e5767171519add6586015ed50b9436df11d00",
        "nli/snli_senteval_devtest/s1.test": "62cb8107dc3c56a4376e5e521842be24e0d61c92c346b94917da2bbf2a47d8be",
        "nli/snli_senteval_devtest/s2.dev": "a8c59709630b64ba103f7784c0cb7104a6baf23234562487264d9634714f5d2b",
        "nli/snli_senteval_devtest/s2.test": "1174f3ad30a3c30fc0f9eeffc1b3b6a79e0514026c5a658968a8e2a324b311a1",
    },
    "trecqa": {
        "qa_pairs/trecqa_wang/README.md": "5443da173ff8acf63d9c4d028cfadcfc806035cb59fe74932f2ab2fd21edc425",
        "qa_pairs/trecqa_wang/dev.csv": "3c266ccaa633e929515bc8643a0615c05f64d2fb62b3a687d85ff7fabdf79a6a",
        "qa_pairs/trecqa_wang/test.csv": "5aaf688f8c79a0eab96c77dcc8919e82006169712a799aa97343588000769288",
        "qa_pairs/trecqa_wang/train.csv": "b3398769dee040bceb5ca4ffe49eaa9096e71c9533432031f3bddfdb3dee7a8f",
    },
    "wikiqa": {
        "qa_pairs/wikiqa/WikiQA-test.tsv": "c035f0db5685dcfe1b2f256ff204528752a1e06f6d1bcae9a1aefac05079b24c",
        "qa_pairs/wikiqa/WikiQA-train.tsv": "91f05770ee859b2bb4091e42e9c4943508433d1f4be955eecf8cb055c302e10e",
    },
    "qatar_living_2015": {
        "semeval2015_task3_cqa/CQA-QL-devel-gold.txt": "63be5e121323479a8e8a3d55b38eb9fd359a349d40411fe6f9ac01994c5522e2",
        "semeval2015_task3_cqa/CQA-QL-devel.xml": "ae2da3bcd54c5ee69b288e3cf2176ff2fce6193181caf276014f61bdaa1b1096",
        "semeval2015_task3_cqa/CQA-QL-test.xml": "32ff7a0cecc167dd23136410d8e6a621ef21639763cc13e226a49adec2d7cbaf",
        "semeval2015_task3_cqa/CQA-QL-trial.xml": "4504b8abba25f4ff13f31fdd8c49148d18dad8965c55a05d0ea1bbf17f48cc20",
        "semeval2015_task3_cqa/README.txt": "300ac455fd895c8548b1af8a938b67bb968ed887801745ab47c209c69aa9a410",
    },
    "qatar_living_2016": {
        "semeval2016_task3_cqa_cleaned/Subtask_A_TEST-BASE.csv": "961de1ca20842c0286010bd6b9a0cf455e955ce0d0319527b25fc0710a9957b7",
        "semeval2016_task3_cqa_cleaned/Subtask_A_VAL-BASE.csv": "472fc1ed1daded344bf74e9cae72e107622f8ecfce2e5a1e041dcc8c9a536b6a",
        "semeval2016_task3_cqa_cleaned/Subtask_B_TEST-BASE.csv": "e18b1263b467b1db4b183696be4afccf274f861109aebb8555bf399adddffdfd",
        "semeval2016_task3_cqa_cleaned/Subtask_B_TRAIN-BASE.csv": "688bd40ce91ed8ae23d2063c3eeb874b460a138345d9abf1af425bd7aaaf9979",
        "semeval2016_task3_cqa_cleaned/Subtask_B_VAL-BASE.csv": "9d6d0295b14bfb7ad3bf06fffc4092a922746268b6330ee85c0bfa935fd2c3d5",
        "semeval2016_task3_cqa_cleaned/Subtask_C_TEST-BASE.csv": "2872ce400fe4aaeb29c9cece42710d7363d660cb893bf62cd162f092a7acaf4f",
        "semeval2016_task3_cqa_cleaned/Subtask_C_VAL-BASE.csv": "f2d9f1c4f13da53e45bd3860ce75deb390a9903db6ba7f7beabcf3161d570179",
        "semeval2016_task3_cqa_cleaned/read.md": "f9cafdc9757d647454cc428c2fa06d4475478f8451457a508a7f0a1777b36ea4",
    },
    "senteval_transfer": {
        "senteval_transfer/CR/custrev.neg": "ec94532766f6f962094841ab3bee2ad6f232f996c3756825a91e78bcc294750f",
        "senteval_transfer/CR/custrev.pos": "91a20a4ffeb5d38a39a4087bb247e16538aff21e7d621ae59738379f39f21732",
        "senteval_transfer/MPQA/mpqa.neg": "8da6e035fa4cea02f0555091096b29a6b3995ff0adf41fad25008dcee066b79e",
        "senteval_transfer/MPQA/mpqa.pos": "7487dbb74c77383e60b292845495163a9e21fb70a4fdacdda933413e43163f0d",
        "senteval_transfer/MR/rt-polarity.neg": "c4ac36eaa8adc8ee31c31f69594bfbe68d83ef5b6db53f1f19b28c0be52f3999",
        "senteval_transfer/MR/rt-polarity.pos": "34e5b0da2d491e46b700b00afe735aaae0962bcfe4f7f22b2d8077e714fa370f",
        "senteval_transfer/MRPC/msr_paraphrase_test.txt": "a04e271090879aaba6423d65b94950c089298587d9c084bf9cd7439bd785f784",
        "senteval_transfer/MRPC/msr_paraphrase_train.txt": "60a9b09084528f0673eedee2b69cb941920f0b8cd0eeccefc464a98768457f89",
        "senteval_transfer/SST/binary/sentiment-dev": "9a6c7403b71a9b762158387afe4431253ae10cdfb2319b5275289f3766f48291",
        "senteval_transfer/SST/binary/sentiment-test": "4fefd1cd67526cf87ebc7fafc3afc21cc7cfa6ae53b45e74f77f9456e3c62752",
        "senteval_transfer/SST/binary/sentiment-train": "10a92a297ec38e262386e5a2713b4bc70e5d18ced88b7f54bd171a26e5b34ab5",
        "senteval_transfer/SST/fine/sentiment-dev": "b2f76c62b960f9fda5c6d751edb125abab4f878eb94a8754239b7f4af647f4c3",
        "senteval_transfer/SST/fine/sentiment-test": "0e2ebb450c231f7b3d67fc932066e7bb26ae7bad8c88488f45ed44ef02eb3c73",
        "senteval_transfer/SST/fine/sentiment-train": "9b52b5f686ed438d4d0274c385369251b3d579b578fddd340ba8a9bae2ca4bee",
        "senteval_transfer/SUBJ/subj.objective": "d8ccd43f1674f1c17e4ab717564e3561cfb719b0db4cfb19e5677427c68ff8a1",
        "senteval_transfer/SUBJ/subj.subjective": "274c2ffe59c204dc4df779848561786f59a98cc20dda3cfdd7d9f76a4f730710",
        "senteval_transfer/TREC/TREC_10.label": "86ad53c8fc9d397ab2f4be7c967d8efb470b260140557d3e57afad69d1b88b76",
        "senteval_transfer/TREC/train_5500.label": "8bd6e79493f43bbd22c364587366a1dced54e1e31259eaa92721a0f526031116",
    },
    "sick": {
        "sick/brmson_semeval2014/SICK_test_annotated.txt": "2b8aa806658d6fc23c6824c83776c2d4fee7556000817b5ec0f982861413b7d0",
        "sick/brmson_semeval2014/SICK_train.txt": "266cf8047149bd1d68138dd30439f3122bff30069740ac6705bb6197d9f1b48e",
        "sick/brmson_semeval2014/SICK_trial.txt": "5a88cfb62f8c6bd2a3cce0f2421ba2cb8c2be5ab4a800f6f01e2c64aafb7db56",
        "sick/brmson_semeval2014/readme.txt": "4ff14a2b07603f2214c2803a6e012048c795be5ba4e5d1d33b87d7210f633bf7",
        "sick/senteval/SICK_test_annotated.txt": "4c9aa1bb3c5bbf732520fe35b23c121739472a38eb47e7d5336e6df51896be02",
        "sick/senteval/SICK_train.txt": "d07bdb73963dda1b2012f4d78c24044cd9503b1109218a518a481616973cf960",
        "sick/senteval/SICK_trial.txt": "0d0786bd8671a0a70614f2f890b8ab24b3c24d1ccb624bcca87618091fbe4f11",
    },
    "squad_dev_reconstructed": {
        "squad_v1.1_dev/dev-v1.1.reconstructed.json": "af1d6dce1cc113b53ee752862680060e7dd9e04ffa4f2c3ea54da180de82ef76",
    },
    "sts12_16": {
        "sts12-16/original/STS12-en-test/00-readme.txt": "d47be1641ac98ac312de6f0746b65683df392f70d843eaac9fb10ebd4cb4cb63",
        "sts12-16/original/STS12-en-test/STS.gs.ALL.txt": "5bcbfda125ad56a1b924763482420b585bea9bf74dc2c18d88d62cd6d2e3422f",
        "sts12-16/original/STS12-en-test/STS.gs.MSRpar.txt": "5526be59228bc34ccb3cb6f1f56c0d7278d3419b8886713ae016fd92b151f19c",
        "sts12-16/original/STS12-en-test/STS.gs.MSRvid.txt": "9c6096c6bcfb0144c8bbddb00900ca9198c88498630cd0c8f08d18365f1d7150",
        "sts12-16/original/STS12-en-test/STS.gs.SMTeuroparl.txt": "708530c4d006d06881f3289fce35d624d7efe562dcf0fe5f8aa0eec3a135f6d4",
        "sts12-16/original/STS12-en-test/STS.gs.surprise.OnWN.txt": "088d8ca22c0aa406e4a5d2e6e308a4f38b482b8e736c2445a38ffb6e4c4fb4fd",
        "sts12-16/original/STS12-en-test/STS.gs.surprise.SMTnews.txt": "aa6dfc868db333c43dc59be14d46fa6587c7ebddc0d497e717f647bf35121cf1",
        "sts12-16/original/STS12-en-test/STS.input.MSRpar.txt": "76bf7089f9e7c05732163a227b3ce679512554513eb783f2548b07d659bd733d",
        "sts12-16/original/STS12-en-test/STS.input.MSRvid.txt": "476d14034a241f71b832e4ae557dd6cdbe265b57c915570a2583f93b4456948d",
        "sts12-16/original/STS12-en-test/STS.input.SMTeuroparl.txt": "dd31dbb6e7eef8a0d00347fe012f7cf372943167e30f60f6fb3b10219a41941f",
        "sts12-16/original/STS12-en-test/STS.input.surprise.OnWN.txt": "07ec7b91348aece0873b41f7fc4e76e9fddf05bdb82c048c98d92f5db0bec07d",
        "sts12-16/original/STS12-en-test/STS.input.surprise.SMTnews.txt": "2788a98ef33c3b7b704ef4891fe863cfcf061338e8aa41cb737d0f137f3ba03c",
        "sts12-16/original/STS13-en-test/00-readme.txt": "531ee28a3787b11dd14dda8d809e724479d87f9705120494aad584c9cb14a6ce",
        "sts12-16/original/STS13-en-test/STS.gs.FNWN.txt": "8ca95b7228119578e2007839cf7969f22c4f1fd41fd610c4b7f9683072d98066",
        "sts12-16/original/STS13-en-test/STS.gs.OnWN.txt": "0cd497aaddb00a2fb6db25f77bccfc09e8aa012e11549b81b434bab1a27ad954",
        "sts12-16/original/STS13-en-test/STS.gs.SMT.txt": "a09775ba2fafc9cbe0a7d0a08f0c729789b0d6c99dc4867a86b45b71a73f004e",
        "sts12-16/original/STS13-en-test/STS.gs.headlines.txt": "f49f64089011436dd296ef384c07160219406feef7dc4b9fa2af52a519f32bc6",
        "sts12-16/original/STS13-en-test/STS.input.FNWN.txt": "b48fc64cd85703ac6431f8ea6722f325fe9620fd4f33b3d5c24dd89c553e74bc",
        "sts12-16/original/STS13-en-test/STS.input.OnWN.txt": "127c66889627f26dc11864dc9be4ba1e4895ed60125985c755429ad588e4b9c8",
        "sts12-16/original/STS13-en-test/STS.input.headlines.txt": "885e6149fff28a79591ba464c13626d03593b822c88c7c04b6564354d31c7561",
        "sts12-16/original/STS14-en-test/00-readme.txt": "9fe9d64362ac42ed24010d5b00f227235a660dc2466fba743f31051fd121ef73",
        "sts12-16/original/STS14-en-test/STS.gs.OnWN.txt": "1c80147df270ea4cfce14a47ed29f8a2f10d5dc016d02836077fd786ff7f535b",
        "sts12-16/original/STS14-en-test/STS.gs.deft-forum.txt": "ba6dc76696b5c93985590a325b4d142449932cdf0d715b2bab1b1743fe3c488c",
        "sts12-16/original/STS14-en-test/STS.gs.deft-news.txt": "105c5b333abd50c274efb4dae9e3e0dab36ed63eee780cfb49955b1586bd62f2",
        "sts12-16/original/STS14-en-test/STS.gs.headlines.txt": "f243c34647255cd0b994565ed4f58dd31506e7d9c9d6250d1a6dd14095625832",
        "sts12-16/original/STS14-en-test/STS.gs.images.txt": "fc994ebacc7074c332626fa9e29542d7340a48a3cdb999b47cdb59c378523a62",
        "sts12-16/original/STS14-en-test/STS.gs.tweet-news.txt": "0098c644bfeaa2d511a8297b1940771865900c372c9dd49a62726dc5ec02c9a3",
        "sts12-16/original/STS14-en-test/STS.input.OnWN.txt": "a227d5fe1c1f729a52a0b39b5b36d3225e1bca3c278e7ed392cac2ecd3990f1c",
        "sts12-16/original/STS14-en-test/STS.input.deft-forum.txt": "8b48aa15bb850e2827446f6e98cc3c5123ff283924b4571a409aa2fab73e35c6",
        "sts12-16/original/STS14-en-test/STS.input.deft-news.txt": "92df5b8c48873cbfba36b73a77955fb965c9244776df9e9c2c4d2f6155bdeefe",
        "sts12-16/original/STS14-en-test/STS.input.headlines.txt": "a19f84294325c62a2a403b59957196fd7737f86654ded0e04e0b54bc4a8bcf9e",
        "sts12-16/original/STS14-en-test/STS.input.images.txt": "cec1b3c08b0e4c88aeaf8dca047f5b28f4a8588eeef58475e0f16491d2bb7193",
        "sts12-16/original/STS14-en-test/STS.input.tweet-news.txt": "250d29ec9394e35443b2a73016ccc55e11b20939a3b8ee3bea9a858ba2f9adc0",
        "sts12-16/original/STS15-en-test/00-readme.txt": "38fe35ef21a0f224b6cc51e00d138810063521cd90458a7d77e4e0aa3a79542d",
        "sts12-16/original/STS15-en-test/STS.gs.answers-forums.txt": "1644301a7540e5484da285002e9269062852efb2272be614cad99c9530f6a102",
        "sts12-16/original/STS15-en-test/STS.gs.answers-students.txt": "028db213140f8c7aef7497c4ae38b6380938f20359852231669c83dce11c3701",
        "sts12-16/original/STS15-en-test/STS.gs.belief.txt": "5736192faaccbdbecd0ef6b73ec04b24115cd2e48d55dc3b1b170da3d2a81c75",
        "sts12-16/original/STS15-en-test/STS.gs.headlines.txt": "e8e432f769c8a94ddb62ae3343890ac24a9dd78a116d56c707313bc59413dd56",
        "sts12-16/original/STS15-en-test/STS.gs.images.txt": "ed8878209098c77ca7f02ac413d3fd698f92ad3425999555e50fda89fc46012a",
        "sts12-16/original/STS15-en-test/STS.input.answers-forums.LICENSE": "65718ec23624d97933308adc08cb270db798cdd5593d35501be9bfda5ba1a28a",
        "sts12-16/original/STS15-en-test/STS.input.answers-forums.txt": "fe8e460a74e8e38704ac4e6ddcedec89fd6e51cd0467d6f4301b444b259688e1",
        "sts12-16/original/STS15-en-test/STS.input.answers-students.txt": "16eedf46fb3b29822b275a0ddcff8e873a6eb4bafba244a17c4049ffc318d62a",
        "sts12-16/original/STS15-en-test/STS.input.belief.txt": "6e924a19fb1abbce01a8666f07766250b46a96c89272de8e5b01d0905bc61b79",
        "sts12-16/original/STS15-en-test/STS.input.headlines.txt": "779c195c54b72282bd3c8ca1dbb09a4155a39b2acd13d5cf819d8555d717cf6a",
        "sts12-16/original/STS15-en-test/STS.input.images.txt": "6f332542a75bcd18ea1442fc129306f746cd7ade7010ea274e763bfca576cc47",
        "sts12-16/original/STS16-en-test/LICENSE.txt": "94b7380d16f832ae97bcb48536f22fe9a22e8e20f8cf88a9298f65c556e3a6f2",
        "sts12-16/original/STS16-en-test/README.txt": "1b74b4c84a59f139153f0348e212bfdb33dffd3b008dfb2c4f7728c4fa27141f",
        "sts12-16/original/STS16-en-test/STS2016.gs.answer-answer.txt": "332efd741b0cb247d20dd2a6cec854360c921c7e6b395f328f562d8d26057214",
        "sts12-16/original/STS16-en-test/STS2016.gs.headlines.txt": "01e33a95996201a6e81e3cce9eda0f15048b77613ea64dce2929bb35479f7d85",
        "sts12-16/original/STS16-en-test/STS2016.gs.plagiarism.txt": "29984944a91aaff484f2b2e5d4d434fc8a6f5ef6f578a880cccd2786f5142fdc",
        "sts12-16/original/STS16-en-test/STS2016.gs.postediting.txt": "81947ed9dbe7f85b7bd249df68ed5c7b2f16f06390ad568eb5554b1e26bc5577",
        "sts12-16/original/STS16-en-test/STS2016.gs.question-question.txt": "cf9ebf9d140191f73620cda0560947ad9283c910735d0d541b8a401a5e64afb0",
        "sts12-16/original/STS16-en-test/STS2016.input.answer-answer.txt": "7daf2cd87751a0f8b754fe705bdb280c31591d9febf5b6fce9dcb10d3b8a72a7",
        "sts12-16/original/STS16-en-test/STS2016.input.headlines.txt": "ec8ee1124e71f4cc18c861f542fa8f32c86fef0703de31b0f7a02e22e935d992",
        "sts12-16/original/STS16-en-test/STS2016.input.plagiarism.txt": "6760cb210f4423262fd8962674e6668409690ce888bb1617659c6886cf004019",
        "sts12-16/original/STS16-en-test/STS2016.input.postediting.txt": "a8a66185877785307803c99a0899d65aefb062c4bf7689560b95d37bb0c05474",
        "sts12-16/original/STS16-en-test/STS2016.input.question-question.txt": "b7f95dead3d8c59fbaacbb135643c6ebd322682db6502fdb24d4ce83c9bf016d",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.gs.ALL.txt": "5bcbfda125ad56a1b924763482420b585bea9bf74dc2c18d88d62cd6d2e3422f",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.gs.MSRpar.txt": "5526be59228bc34ccb3cb6f1f56c0d7278d3419b8886713ae016fd92b151f19c",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.gs.MSRvid.txt": "9c6096c6bcfb0144c8bbddb00900ca9198c88498630cd0c8f08d18365f1d7150",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.gs.SMTeuroparl.txt": "708530c4d006d06881f3289fce35d624d7efe562dcf0fe5f8aa0eec3a135f6d4",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.gs.surprise.OnWN.txt": "088d8ca22c0aa406e4a5d2e6e308a4f38b482b8e736c2445a38ffb6e4c4fb4fd",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.gs.surprise.SMTnews.txt": "aa6dfc868db333c43dc59be14d46fa6587c7ebddc0d497e717f647bf35121cf1",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.input.MSRpar.txt": "093b36d9cc1cd26364885c0f5d5be7ed024f475bceb552384f7fd489174b3c4f",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.input.MSRvid.txt": "5a007f6882ed3398afdbb0d1ed093457c4adbac82a5b411ea356e0985650c39f",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.input.SMTeuroparl.txt": "971d76409ebd10a2285a846a20fd035e4e4ba2f85054e2869f5b41bb3182ca82",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.input.surprise.OnWN.txt": "1059c1b66fc72071881175754d3a01158e423ec6b032e1dd87b18fc7ecb1e8d9",
        "sts12-16/senteval_tokenized/STS12-en-test/STS.input.surprise.SMTnews.txt": "048cbedbba58a136722e9d102f0416326aa04644180e031318c28caf90258585",
        "sts12-16/senteval_tokenized/STS13-en-test/STS.gs.FNWN.txt": "8ca95b7228119578e2007839cf7969f22c4f1fd41fd610c4b7f9683072d98066",
        "sts12-16/senteval_tokenized/STS13-en-test/STS.gs.OnWN.txt": "0cd497aaddb00a2fb6db25f77bccfc09e8aa012e11549b81b434bab1a27ad954",
        "sts12-16/senteval_tokenized/STS13-en-test/STS.gs.SMT.txt": "a09775ba2fafc9cbe0a7d0a08f0c729789b0d6c99dc4867a86b45b71a73f004e",
        "sts12-16/senteval_tokenized/STS13-en-test/STS.gs.headlines.txt": "f49f64089011436dd296ef384c07160219406feef7dc4b9fa2af52a519f32bc6",
        "sts12-16/senteval_tokenized/STS13-en-test/STS.input.FNWN.txt": "7bcc0fc86d30c8980c9ac9735c612492abd236524bec32bed98070e225b2e023",
        "sts12-16/senteval_tokenized/STS13-en-test/STS.input.OnWN.txt": "3c616d878f3d7bfbadce1657bcc5a78d7d429fd10fc2e31195d314543fecab1a",
        "sts12-16/senteval_tokenized/STS13-en-test/STS.input.headlines.txt": "e60c724b4b620802f42d7696f27e6a8153205a716b142f0a051e2b2b2e99e505",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.gs.OnWN.txt": "1c80147df270ea4cfce14a47ed29f8a2f10d5dc016d02836077fd786ff7f535b",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.gs.deft-forum.txt": "ba6dc76696b5c93985590a325b4d142449932cdf0d715b2bab1b1743fe3c488c",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.gs.deft-news.txt": "105c5b333abd50c274efb4dae9e3e0dab36ed63eee780cfb49955b1586bd62f2",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.gs.headlines.txt": "f243c34647255cd0b994565ed4f58dd31506e7d9c9d6250d1a6dd14095625832",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.gs.images.txt": "fc994ebacc7074c332626fa9e29542d7340a48a3cdb999b47cdb59c378523a62",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.gs.tweet-news.txt": "0098c644bfeaa2d511a8297b1940771865900c372c9dd49a62726dc5ec02c9a3",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.input.OnWN.txt": "52f462f085f6920f70115761c50924f16a4fd6caec2cfccec82311619c1be326",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.input.deft-forum.txt": "7d52c9b130cf0d0291b2f2ea5324363219267ffcecf0a56f4306503adb231714",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.input.deft-news.txt": "2416e9f1a13136ac213cbfd413d98cd8504edcca21c87deef3aa5c1207bc1448",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.input.headlines.txt": "08e808b7786ec7b830badf9843c55fc7930467ae75e2cd6fe8fd518496b66730",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.input.images.txt": "3d44abc6af8d8b1c69b6e93bb386176d5896985dba91a13e5587350e92a90c83",
        "sts12-16/senteval_tokenized/STS14-en-test/STS.input.tweet-news.txt": "6b0173393868ea87f315f32971bff68b328e466678f481d4710d8488e7cc90de",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.gs.answers-forums.txt": "1644301a7540e5484da285002e9269062852efb2272be614cad99c9530f6a102",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.gs.answers-students.txt": "028db213140f8c7aef7497c4ae38b6380938f20359852231669c83dce11c3701",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.gs.belief.txt": "5736192faaccbdbecd0ef6b73ec04b24115cd2e48d55dc3b1b170da3d2a81c75",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.gs.headlines.txt": "e8e432f769c8a94ddb62ae3343890ac24a9dd78a116d56c707313bc59413dd56",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.gs.images.txt": "ed8878209098c77ca7f02ac413d3fd698f92ad3425999555e50fda89fc46012a",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.input.answers-forums.txt": "65e3f55333c53897c6791ff154a490857a827d4699bc2d1f18e53693dbfd0c39",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.input.answers-students.txt": "4893f736e84cea176c39c882250f6513d5bbcfa6ebe8d3ffabcef6056d0471a7",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.input.belief.txt": "ce09c4713480fd622afbc362d22dd7ffb4e5fc6ee676602368af6f63f9ea7cb5",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.input.headlines.txt": "91f2a6152c574e17544c5e8a856338fa8632898b44c10d2cc9c9516ddfe682c5",
        "sts12-16/senteval_tokenized/STS15-en-test/STS.input.images.txt": "98b2f560e4a3e13253f10b7fd8855006dd327ab272559ab690f2c4e1e5aebca7",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.gs.answer-answer.txt": "332efd741b0cb247d20dd2a6cec854360c921c7e6b395f328f562d8d26057214",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.gs.headlines.txt": "01e33a95996201a6e81e3cce9eda0f15048b77613ea64dce2929bb35479f7d85",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.gs.plagiarism.txt": "29984944a91aaff484f2b2e5d4d434fc8a6f5ef6f578a880cccd2786f5142fdc",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.gs.postediting.txt": "81947ed9dbe7f85b7bd249df68ed5c7b2f16f06390ad568eb5554b1e26bc5577",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.gs.question-question.txt": "cf9ebf9d140191f73620cda0560947ad9283c910735d0d541b8a401a5e64afb0",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.input.answer-answer.txt": "92e66262159e39cb623690e243179f447fb08d493ccec6e600a021b76dd6fe9a",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.input.headlines.txt": "f439e10cf28d9cb4dc7642a072f6ac9ac48922f147241af8fe5df3048f24804b",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.input.plagiarism.txt": "78f5fb0756400485676f82a47703dab0402ba273a887a6d846e9790ff9300f87",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.input.postediting.txt": "cb8e2337a17ecc60a4fb57ecb17c692e13257802d24c9bd401b4bfa574510463",
        "sts12-16/senteval_tokenized/STS16-en-test/STS.input.question-question.txt": "0b8d495236ea8c9e9eddf529b40d8570e4b38ef29a40d194d5487613b064a4bc",
    },
    "stsb": {
        "stsb/original/LICENSE.txt": "3dfc3217395f8c5dd05c5f8995f25fe2f8fd258e6dd770b3de480749caee8c70",
        "stsb/original/readme.txt": "e9488363d211c32ca5e912954f16eb9233cfed1b5b4b0475d0d812d35d7c8ef1",
        "stsb/original/sts-dev.csv": "5d7e944d8b02734b07bfdb5df67db3420c64bed153fcaa1ba47ad03480cf4234",
        "stsb/original/sts-test.csv": "affe45928a66ee5a708531233c95b7dacbbdc57f974f002a3d32ea0180cf816a",
        "stsb/original/sts-train.csv": "0f71910b59aa1ad973c5897f0791f3b0965a92b8f82b1a95f3eea9f4162fda82",
        "stsb/senteval_tokenized/sts-dev.csv": "fd3e4e429f32e352c7c7c76aea5c3383ee95eb98e482796b34e4e7b88a8392f3",
        "stsb/senteval_tokenized/sts-test.csv": "4cde2a19c9b7232c9ce92a89e5afd99805c8f66ba432a7824e0a5bad1a0a0ea0",
        "stsb/senteval_tokenized/sts-train.csv": "6466868d4b49a575530554224fe2e7d8cc03e83e1f326c90e561b81bf5031fec",
    },
    "t5_vocab": {
        "t5_spiece/spiece.model": "d60acb128cf7b7f2536e8f38a5b18a05535c9e14c7a355904270e15b0945ea86",
    },
}

_SYNWMD = ("amao0o0/SynWMD", "59042a9")
_SIMCSE_REPO = ("robertoviegas/SimCSE", "a0d98a5")
_BRMSON = ("brmson/dataset-sts", "e1d3375")
_STS_ZIPS = {
    "STS12": ("http://ixa2.si.ehu.es/stswiki/images/4/40/STS2012-en-test.zip", "test-gold"),
    "STS13": ("http://ixa2.si.ehu.es/stswiki/images/2/2f/STS2013-en-test.zip", "test-gs"),
    "STS14": ("http://ixa2.si.ehu.es/stswiki/images/8/8c/STS2014-en-test.zip", "sts-en-test-gs-2014"),
    "STS15": ("http://ixa2.si.ehu.es/stswiki/images/d/da/STS2015-en-test.zip", "test_evaluation_task2a"),
    "STS16": ("http://ixa2.si.ehu.es/stswiki/images/9/98/STS2016-en-test.zip", "sts2016-english-with-gs-v1.0"),
}
_STSB_TARBALL = "http://ixa2.si.ehu.es/stswiki/images/4/48/Stsbenchmark.tar.gz"
_SICK_UPLOADS = "http://alt.qcri.org/semeval2014/task1/data/uploads"
_T5_VOCAB_URL = "https://storage.googleapis.com/t5-data/vocabs/cc_all.32000/sentencepiece.model"


def _urls(relpath: str) -> tuple[str, ...]:
  """Canonical URLs of one file of the shared layout."""
  parts = relpath.split("/")
  name = parts[-1]
  if relpath == "t5_spiece/spiece.model":
    return (_T5_VOCAB_URL, github("pytorch/text", "a5e6106", "test/torchtext_unittest/asset/t5_tokenizer_base.model"))
  if relpath.startswith("stsb/original/"):
    return (f"{_STSB_TARBALL}#stsbenchmark/{name}",
            github(*_SYNWMD, f"data/downstream/STS/STSBenchmark/stsbenchmark/{name}"))
  if relpath.startswith("stsb/senteval_tokenized/"):
    return (github(*_SYNWMD, f"data/downstream/STS/STSBenchmark/{name}"),)
  if relpath.startswith("sts12-16/original/"):
    year = parts[2].split("-")[0]
    url, subdir = _STS_ZIPS[year]
    return (f"{url}#{subdir}/{name}",)
  if relpath.startswith("sts12-16/senteval_tokenized/"):
    return (github(*_SYNWMD, f"data/downstream/STS/{parts[2]}/{name}"),)
  if relpath.startswith("sick/senteval/"):
    official = f"{_SICK_UPLOADS}/{name[:-4].lower()}.zip#{name}"
    return (official, github("yan-soares/research_embeddings_fine_tuning", "045c5e9", f"data/downstream/SICK/{name}"))
  if relpath.startswith("sick/brmson_semeval2014/"):
    return (github(*_BRMSON, f"data/sts/sick2014/{name}"),)
  if relpath.startswith("senteval_transfer/"):
    sub = "/".join(parts[1:])
    urls = []
    if parts[1] == "TREC":
      urls.append(f"https://cogcomp.seas.upenn.edu/Data/QA/QC/{name}")
    if parts[1] == "MRPC":
      urls.append(f"https://dl.fbaipublicfiles.com/senteval/senteval_data/{name}")
    if parts[1] == "SST" and parts[2] == "binary":
      urls.append(f"https://raw.githubusercontent.com/PrincetonML/SIF/master/data/{name}")
    urls.append(github(*_SIMCSE_REPO, f"SentEval/data/downstream/{sub}"))
    return tuple(urls)
  if relpath.startswith("glue/"):
    return (github("F0restL1n/BERT", "0d0288b", "glue_data/" + "/".join(parts[1:])),)
  if relpath.startswith("nli/snli_senteval_devtest/"):
    return (github(*_SIMCSE_REPO, f"SentEval/data/downstream/SNLI/{name}"),)
  if relpath.startswith("qa_pairs/trecqa_wang/"):
    return (github(*_BRMSON, f"data/anssel/wang/{name}"),)
  if relpath.startswith("qa_pairs/wikiqa/"):
    urls = []
    if name == "WikiQA-test.tsv":
      urls.append("https://download.microsoft.com/download/E/5/F/E5FCFCEE-7005-4814-853D-DAA7C66507E0/"
                  "WikiQACorpus.zip#WikiQACorpus/WikiQA-test.tsv")
    urls.append(github("SiemensHalske/DataAlchemist", "f00790c", f"data/{name}"))
    return tuple(urls)
  if relpath.startswith("semeval2016_task3_cqa_cleaned/"):
    if name == "read.md":
      path = "dataset/read.md"
    else:
      subtask, rest = name[len("Subtask_"):].split("_", 1)
      path = f"dataset/Subtask {subtask}/{rest}"
    return (github("chaobotic-vasu/Community-Question-Answering", "9febaf7", path),)
  if relpath.startswith("semeval2015_task3_cqa/"):
    base = "semeval2015-3/data/SemEval2015-Task3-English-data"
    if name == "README.txt":
      return (github("diyessi/Iyas", "3773b29", f"{base}/{name}"),)
    urls = [github("diyessi/Iyas", "3773b29", f"{base}/datasets/{name}")]
    if name == "CQA-QL-test.xml":
      urls.append(github("diyessi/Iyas", "3773b29", f"{base}/datasets/emnlp15/{name}"))
    return tuple(urls)
  return ()  # derived (see its Recipe) or local-only


def _dataset(name: str, description: str, note: str = "", derived: Recipe | None = None) -> Dataset:
  files = tuple(RemoteFile(p, h, _urls(p)) for p, h in sorted(CHECKSUMS[name].items()))
  return Dataset(name, description, files, note=note, derived=derived)


DATASETS: dict[str, Dataset] = {d.name: d for d in [
    _dataset("t5_vocab", "T5 SentencePiece vocabulary cc_all.32000 (32000 pieces)"),
    _dataset("stsb", "STS Benchmark train/dev/test, official and SentEval-tokenised"),
    _dataset("sts12_16", "STS 2012-2016 English test sets, official and SentEval-tokenised"),
    _dataset("sick", "SICK train/trial/test (SentEval and SemEval-2014 copies); CC BY-NC-SA 3.0"),
    _dataset("senteval_transfer", "SentEval transfer tasks MR, CR, SUBJ, MPQA, SST, TREC, MRPC"),
    _dataset("glue", "GLUE task files (CoLA, SST-2, MRPC, RTE, STS-B, QNLI dev/test, WNLI, diagnostic)"),
    _dataset("snli_senteval", "SNLI dev/test in SentEval's s1/s2/labels layout"),
    # The README's main job (gin/st5_tiny_cpu.gin) trains on it: `prepare` derives it, so a first run needs no copy.
    _dataset("snli_triples_derived", "6,339 SimCSE-format triples derived here from SNLI dev/test",
             note="derived by `st5 data prepare` from snli_senteval, sha256-checked",
             derived=Recipe("snli_devtest_triples", ("snli_senteval",),
                            "st5 data nli-triples --mode per_entailment on nli/snli_senteval_devtest/s1.dev and "
                            "s1.test, rows tagged with a split column (dev, then test)")),
    _dataset("trecqa", "TREC-QA answer sentence selection (Wang et al. 2007; Yao et al. 2013)"),
    _dataset("wikiqa", "WikiQA answer sentence selection"),
    _dataset("squad_dev_reconstructed", "SQuAD v1.1 dev rebuilt from the SQuAD explorer pages",
             note="reconstructed: differs from the official dev-v1.1.json (answer_start offsets), so local-only; "
                  "read by no training task, the README's main job or `st5 eval`'s default suites (SentGLUE-QNLI "
                  "reads glue/QNLI), only by the builders' tests and, without the official file (squad_official), "
                  "by the retrieval suite's SQuAD sets: `prepare` skips it unless a copy is at hand"),
    _dataset("qatar_living_2016", "SemEval-2016 Task 3 Qatar Living CQA, cleaned CSV (subtasks A, B, C)"),
    _dataset("qatar_living_2015", "SemEval-2015 Task 3 Qatar Living CQA, English XML (dev, test, trial)"),
    # Optional: not in the development data; checksums unknown here (--trust-unverified records them).
    Dataset("simcse_nli", "SimCSE's nli_for_simcse.csv: the paper's 275K SNLI+MNLI triples",
            (RemoteFile("nli/nli_for_simcse.csv", None, (
                "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/nli_for_simcse.csv",)),),
            optional=True),
    Dataset("squad_official", "Official SQuAD v1.1 train and dev JSON",
            (RemoteFile("squad_v1.1/train-v1.1.json", None,
                        ("https://rajpurkar.github.io/SQuAD-explorer/dataset/train-v1.1.json",)),
             RemoteFile("squad_v1.1/dev-v1.1.json", None,
                        ("https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v1.1.json",))),
            optional=True),
    Dataset("snli_full", "SNLI 1.0 (570K pairs) jsonl, for building NLI triples",
            tuple(RemoteFile(f"nli/snli_1.0/snli_1.0_{s}.jsonl", None,
                             (f"https://nlp.stanford.edu/projects/snli/snli_1.0.zip#snli_1.0/snli_1.0_{s}.jsonl",))
                  for s in ("train", "dev", "test")), optional=True),
    Dataset("mnli_full", "MultiNLI 1.0 jsonl, for building NLI triples",
            tuple(RemoteFile(f"nli/multinli_1.0/multinli_1.0_{s}.jsonl", None,
                             (f"https://cims.nyu.edu/~sbowman/multinli/multinli_1.0.zip#multinli_1.0/multinli_1.0_{s}.jsonl",))
                  for s in ("train", "dev_matched", "dev_mismatched")), optional=True),
]}

CORE_DATASETS = tuple(n for n, d in DATASETS.items() if not d.optional)

# The datasets of the evaluation sets public tasks are decontaminated against (st5_jax.data.overlap: every set of
# st5_jax.evaluation.sets, the retrieval sets' SQuAD dev, Qatar Living B, WikiQA and TREC-QA included); part of every
# prepared task's fingerprint, so a task is rebuilt when they change or arrive (e.g. a SQuAD dev copy added later).
EVALUATION_DATASETS = ("stsb", "sts12_16", "sick", "senteval_transfer", "glue", "qatar_living_2016", "wikiqa",
                       "trecqa", "squad_official", "squad_dev_reconstructed")
# Which datasets each public task is built from (prepare builds a task when all are present).
TASK_DATASETS: dict[str, tuple[str, ...]] = {
    # SQuAD *train* only: GLUE QNLI dev (SentGLUE-QNLI) is built from SQuAD dev.
    "st5_reqa_squad_sentences": ("squad_official",),
    "st5_qatar_living_good_answers": ("qatar_living_2015", "qatar_living_2016"),
    "st5_qatar_living_perfect_match": ("qatar_living_2016",),
    "st5_trecqa_positives": ("trecqa",),
    "st5_wikiqa_positives": ("wikiqa",),
    "st5_snli_devtest_triples": ("snli_triples_derived",),
    "st5_simcse_nli_triples": ("simcse_nli",),
}
