"""A broad chat prompt distribution for distilling a SmolLM2 draft: what people ask a
small instruct model (questions, how-tos, explanations, advice, short writing, lists,
summaries, simple code, short translations).

Two sources, both free of third-party text:

* `templated_prompts`: instruction templates x topic lists written for this module
  (`TEMPLATES`, `TOPICS`, `PARAGRAPHS`, `PHRASES`); every (template, topic) pair of a
  category, in a seeded order.
* `self_prompts`: user messages the target writes itself, by sampling the user turn
  of its own chat template (the ids up to `<|im_start|>user\\n`, decoded at
  temperature 1 until the turn ends), de-duplicated and filtered
  (`clean_self_prompt`). SmolLM2-135M-Instruct is Apache-2.0; what it writes carries
  no other terms.

No evaluation text may be in a training prompt: `overlapping` finds the training
prompts that share a word n-gram (`NGRAM` words, case and punctuation folded) with
any evaluation prompt (`lm_eval_sets`), and `training_prompts` drops them (the test
checks that none is left).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import dataclasses
import itertools
import json
import os
import re

import numpy as np

NGRAM = 6

TEMPLATES = {
  "question": (
    "What is {}?",
    "Can you tell me about {}?",
    "I have always wondered about {}. What is the story there?",
    "Give me a quick answer: what should I know about {}?",
    "Quick question about {}: why does it matter?",
    "What are the basic facts about {}?",
    "Tell me something interesting about {}.",
    "Could you answer briefly: what is the deal with {}?",
  ),
  "howto": (
    "How do I {}?",
    "What is the easiest way to {}?",
    "Give me step-by-step instructions to {}.",
    "I am a beginner. How can I {}?",
    "Any tips on how to {}?",
    "Explain the process to {}.",
    "What do I need to {}?",
    "Teach me how to {} in a few steps.",
  ),
  "explain": (
    "Explain {} in simple terms.",
    "Explain {} to a child.",
    "How does {} work?",
    "Describe {} briefly.",
    "What is the idea behind {}?",
    "Break down {} for a beginner.",
    "Give a short explanation of {}.",
    "Why is {} important?",
  ),
  "advice": (
    "I need some advice: {}",
    "Can you help? {}",
    "What would you suggest? {}",
    "Give me some advice. {}",
    "{} What should I do?",
    "{} Any ideas?",
  ),
  "writing": (
    "Write a short poem about {}.",
    "Write a short story about {}.",
    "Write a haiku about {}.",
    "Write a paragraph describing {}.",
    "Write a limerick about {}.",
    "Write a short blog post about {}.",
    "Write a tweet about {}.",
    "Write a short speech about {}.",
  ),
  "list": (
    "List five facts about {}.",
    "Give me a list of ideas related to {}.",
    "What are three common mistakes people make with {}?",
    "Name some pros and cons of {}.",
    "List the main things to know about {}.",
    "Give me 5 tips about {}.",
    "What are some fun facts about {}?",
    "Make a short checklist for {}.",
  ),
  "code": (
    "Write a Python function to {}.",
    "Show me how to {} in Python.",
    "Write code that can {}.",
    "In JavaScript, how would I {}?",
    "Give an example program to {}.",
    "Write a short script to {}.",
  ),
  "translate": (
    "Translate to Spanish: {}",
    "Translate to French: {}",
    "Translate to German: {}",
    "Translate this into Italian: {}",
    "How would you say this in Portuguese? {}",
    "Translate from English to Dutch: {}",
  ),
  "summary": (
    "Summarize this: {}",
    "Summarize in one sentence: {}",
    "TL;DR: {}",
    "What is the main idea of this paragraph? {}",
    "Shorten this text: {}",
    "Rewrite this more simply: {}",
  ),
}

TOPICS = {
  "question": (
    "black holes",
    "the Great Wall of China",
    "honey bees",
    "the Roman Empire",
    "the Amazon rainforest",
    "earthquakes",
    "the human heart",
    "coral reefs",
    "the Olympic Games",
    "penguins",
    "the Eiffel Tower",
    "dinosaurs",
    "the water cycle",
    "solar panels",
    "the Sahara desert",
    "chess",
    "jazz music",
    "the Moon landing",
    "DNA",
    "the internet",
    "antibiotics",
    "glaciers",
    "the stock market",
    "hurricanes",
    "the periodic table",
    "Mount Everest",
    "coffee",
    "the pyramids of Egypt",
    "electric cars",
    "tea",
    "whales",
    "the Renaissance",
    "recycling",
    "the speed of light",
    "Mars",
    "chocolate",
    "the Nile river",
    "bamboo",
    "elephants",
    "the French Revolution",
    "lightning",
    "the immune system",
    "wind turbines",
    "octopuses",
    "the Industrial Revolution",
    "airplanes",
    "the brain",
    "rainbows",
    "the Milky Way",
    "soccer",
    "yoga",
    "sharks",
    "the Arctic",
    "money",
    "microplastics",
    "the Silk Road",
    "butterflies",
    "Shakespeare",
    "the metric system",
    "nuclear energy",
    "mushrooms",
    "submarines",
    "bicycles",
    "the calendar",
    "cheese",
    "wolves",
    "the ozone layer",
    "fireworks",
    "deserts",
    "Vikings",
    "telescopes",
    "the printing of books",
    "rice",
  ),
  "howto": (
    "make pancakes",
    "learn a new language",
    "start a vegetable garden",
    "write a resume",
    "fix a leaky faucet",
    "bake bread",
    "save money",
    "learn to swim",
    "make a budget",
    "clean a laptop keyboard",
    "train a puppy",
    "tie a tie",
    "start meditating",
    "make friends in a new city",
    "study for an exam",
    "brew coffee at home",
    "improve my handwriting",
    "take better photos with my phone",
    "write a cover letter",
    "make a paper airplane",
    "organize my closet",
    "cook rice",
    "learn to play guitar",
    "sleep better",
    "repot a plant",
    "make a smoothie",
    "back up my files",
    "stay focused while working",
    "wash a wool sweater",
    "plan a road trip",
    "make homemade pizza",
    "start a podcast",
    "learn to code",
    "keep a journal",
    "negotiate a salary",
    "make a simple website",
    "care for a cactus",
    "stop procrastinating",
    "make lemonade",
    "change a light bulb",
    "write a good email",
    "paint a room",
    "set up a fish tank",
    "start running",
    "knit a scarf",
    "make a grocery list",
    "get rid of fruit flies",
    "read faster",
    "prepare a healthy lunch",
    "give a presentation",
  ),
  "explain": (
    "photosynthesis",
    "electricity",
    "the stock market",
    "machine learning",
    "blockchain",
    "the greenhouse effect",
    "evolution",
    "compound interest",
    "a credit score",
    "the seasons",
    "how airplanes fly",
    "a black hole",
    "supply and demand",
    "the water cycle",
    "vaccines",
    "democracy",
    "a computer virus",
    "gravity",
    "the moon phases",
    "a budget",
    "recycling",
    "time zones",
    "the immune system",
    "cloud computing",
    "taxes",
    "magnets",
    "sound waves",
    "the digestive system",
    "renewable energy",
    "encryption",
    "a rainbow",
    "the food chain",
    "an election",
    "plate tectonics",
    "GPS",
    "a hashtag",
    "insurance",
    "the heartbeat",
    "fermentation",
    "an algorithm",
    "a recession",
    "the Big Bang",
    "a battery",
    "erosion",
    "friction",
    "artificial intelligence",
    "a mortgage",
    "static electricity",
    "a fever",
    "the electoral college",
  ),
  "advice": (
    "I have trouble waking up in the morning.",
    "My friend forgot my birthday and I feel hurt.",
    "I want to eat healthier but I love sweets.",
    "I am moving to a new country next month.",
    "I get distracted by my phone all the time.",
    "My team at work does not communicate well.",
    "I want to learn to draw but I think I have no talent.",
    "I spend too much money on takeout.",
    "I am starting university soon.",
    "My room is always messy.",
    "I want to ask my boss for a day off.",
    "My plants keep dying.",
    "I am bored of my workout routine.",
    "I have a big exam in a week.",
    "I want to be more confident.",
    "My sister and I argue a lot.",
    "I cannot decide which laptop to buy.",
    "I want to read more books.",
    "I feel lonely after moving.",
    "I have too many emails to answer.",
    "I want to get better at cooking.",
    "I need a gift for my dad.",
    "My dog barks at every noise.",
    "I want to change careers.",
    "I feel stressed about deadlines.",
    "I want to drink more water.",
    "I am afraid of flying.",
    "I need to prepare a wedding toast.",
    "My kids spend too much time on screens.",
    "I want to start volunteering.",
    "I forget people's names quickly.",
    "I want to wake up earlier.",
    "I have a job offer in another city.",
    "I keep losing my keys.",
    "I want to make my small apartment feel bigger.",
  ),
  "writing": (
    "the ocean",
    "autumn leaves",
    "a lost cat",
    "friendship",
    "a rainy day",
    "the city at night",
    "a robot who learns to paint",
    "winter",
    "a dragon",
    "the first day of school",
    "a cup of coffee",
    "the stars",
    "a garden",
    "a train journey",
    "a grandmother's kitchen",
    "a snowy forest",
    "a summer festival",
    "an old bookshop",
    "a brave mouse",
    "the desert",
    "a lighthouse keeper",
    "a thunderstorm",
    "the moon",
    "a birthday party",
    "a small town",
    "time travel",
    "a runaway balloon",
    "the mountains",
    "a talking tree",
    "the sea",
    "a soccer match",
    "spring flowers",
    "a pirate ship",
    "a new job",
    "a street musician",
    "a quiet morning",
    "a fox in the snow",
    "the last day of summer",
    "a magic key",
    "a busy market",
  ),
  "list": (
    "healthy eating",
    "traveling on a budget",
    "learning to cook",
    "the planets",
    "public speaking",
    "working from home",
    "keeping a pet rabbit",
    "camping",
    "saving energy at home",
    "job interviews",
    "studying",
    "gardening",
    "running a marathon",
    "moving house",
    "birthday parties",
    "online safety",
    "time management",
    "photography",
    "first aid",
    "hiking",
    "reading habits",
    "learning a language",
    "the ocean",
    "winter driving",
    "composting",
    "staying hydrated",
    "starting a business",
    "recycling",
    "baking",
    "the solar system",
    "dogs",
    "ancient Egypt",
    "volcanoes",
    "bees",
    "video games",
    "cycling to work",
    "writing a novel",
    "spring cleaning",
    "making new friends",
    "a family picnic",
  ),
  "code": (
    "check if a number is prime",
    "sort a list of numbers",
    "count the vowels in a string",
    "compute the factorial of a number",
    "find the average of a list",
    "check if a word is a palindrome",
    "convert Celsius to Fahrenheit",
    "read a text file line by line",
    "remove duplicates from a list",
    "generate a random password",
    "print the Fibonacci sequence",
    "find the smallest element in an array",
    "merge two dictionaries",
    "count how often each word appears",
    "reverse a list",
    "check if a year is a leap year",
    "sum the digits of a number",
    "capitalize every word in a sentence",
    "find the second largest number",
    "flatten a nested list",
    "validate an email address",
    "calculate the area of a circle",
    "convert a string to uppercase",
    "shuffle a list",
    "find common elements in two lists",
    "print a multiplication table",
    "count lines in a file",
    "swap two variables",
    "compute the power of a number",
    "check if a list is sorted",
  ),
  "translate": (
    "Where is the train station?",
    "I love reading books in the evening.",
    "The weather is beautiful today.",
    "Can you help me, please?",
    "My brother works in a hospital.",
    "We are going to the beach tomorrow.",
    "How much does this cost?",
    "I am learning to play the piano.",
    "The cat is sleeping on the sofa.",
    "Happy birthday, my friend!",
    "I would like to book a table for two.",
    "The museum is open on Mondays.",
    "She speaks three languages.",
    "Please close the window.",
    "What time does the shop open?",
    "I have two sisters and one brother.",
    "The children are playing in the park.",
    "This soup is delicious.",
    "I need a new pair of shoes.",
    "See you next week.",
    "Our flight leaves at noon.",
    "He is a very good cook.",
    "It is raining again.",
    "Where can I buy a ticket?",
    "I like to walk my dog in the morning.",
    "The book is on the table.",
    "Do you have a map of the city?",
    "My favourite colour is green.",
    "We watched a movie last night.",
    "The doctor will see you now.",
  ),
}

# Short paragraphs written for the summary templates.
PARAGRAPHS = (
  "Many cities are planting trees along their streets. Trees give shade, cool the "
  "air in summer, and make neighbourhoods more pleasant. They also soak up "
  "rainwater, which helps prevent flooding after storms.",
  "Learning to play an instrument takes patience. Most beginners practise for a "
  "few minutes every day and slowly build up their skills. Over time, regular "
  "practice matters more than long sessions once a week.",
  "The local library has started lending tools as well as books. People can now "
  "borrow drills, ladders and garden equipment for a week at a time, which saves "
  "money and space at home.",
  "Sleep plays an important role in memory. While we sleep, the brain sorts the "
  "information from the day and stores what is useful. People who sleep well "
  "often remember new facts better.",
  "A small company in the town began making bicycles from bamboo. The frames are "
  "light and strong, and the bamboo grows quickly, so the company says its bikes "
  "are better for the environment.",
  "Kitchen waste such as vegetable peels and coffee grounds can be turned into "
  "compost. After a few months, it becomes rich soil that gardeners use to help "
  "their plants grow.",
  "The school introduced a reading hour every Friday. Students choose any book "
  "they like and read quietly. Teachers say the children now talk about books "
  "much more often.",
  "Walking for half an hour a day can improve health. It strengthens the heart, "
  "helps control weight and can lift a person's mood, and it needs no special "
  "equipment.",
  "The museum opened a new room about space travel. Visitors can see a real "
  "astronaut suit, try a flight simulator and learn how rockets leave the Earth.",
  "Farmers in the valley have started using drones to check their fields. The "
  "drones take pictures that show which plants need more water, so less water is "
  "wasted.",
  "Honey never really goes bad. Archaeologists have found pots of honey in "
  "ancient tombs that were still safe to eat, because honey has very little water "
  "and is slightly acidic.",
  "The city is replacing old street lights with LED lamps. The new lamps use less "
  "electricity, last longer and can be dimmed late at night when the streets are "
  "empty.",
  "Some people keep a gratitude journal, writing down three good things every "
  "evening. Studies suggest that this habit can make people feel happier and "
  "sleep better.",
  "A group of volunteers cleaned the beach on Sunday morning. They collected more "
  "than fifty bags of rubbish, mostly plastic bottles and fishing nets, and sorted "
  "them for recycling.",
  "Octopuses are very clever animals. They can open jars, escape from tanks and "
  "change the colour of their skin in less than a second to hide from predators.",
  "The bakery on the corner now sells yesterday's bread at half price in the "
  "morning. The owner says it reduces waste and brings in new customers.",
)


def templated_prompts(seed: int = 0) -> list[dict]:
  """Every (template, topic) prompt of every category, in a seeded order that takes
  the categories in turn (so any prefix is a balanced mix)."""
  rng = np.random.default_rng(seed)
  queues = []
  for category, templates in TEMPLATES.items():
    topics = PARAGRAPHS if category == "summary" else TOPICS[category]
    rows = [
      dict(content=t.format(x), source="templated", category=category, template=i, topic=j)
      for (i, t), (j, x) in itertools.product(enumerate(templates), enumerate(topics))
    ]
    queues.append([rows[k] for k in rng.permutation(len(rows))])
  out = []
  while any(queues):
    for q in queues:
      if q:
        out.append(q.pop())
  return out


# ------------------------------------------------------------------------------
# Prompts the target writes.
# ------------------------------------------------------------------------------
def user_turn_prefix(tok) -> list[int]:
  """The chat template's ids before a user message's text (system turn included)."""
  marker = "XQXQ"
  ids = tok.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=False)
  marker_ids = tok.encode(marker, add_special_tokens=False)
  for start in range(len(ids) - len(marker_ids) + 1):
    if list(ids[start : start + len(marker_ids)]) == list(marker_ids):
      return list(ids[:start])
  raise ValueError("tok: the chat template does not hold the user text as encoded")


def clean_self_prompt(text: str, min_words: int = 4, max_words: int = 80) -> str | None:
  """A target-written user turn as a prompt, or None: whitespace collapsed; dropped
  when too short or long, not mostly ASCII letters, or holding a chat marker."""
  text = " ".join(text.split())
  words = text.split()
  if not min_words <= len(words) <= max_words or "<|" in text or "|>" in text:
    return None
  letters = sum(c.isascii() and (c.isalpha() or c.isspace()) for c in text)
  if letters < 0.8 * len(text):
    return None
  return text


def normalize(text: str) -> str:
  return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def dedupe(texts: Iterable[str]) -> list[str]:
  """First occurrences, compared after `normalize`."""
  seen, out = set(), []
  for t in texts:
    key = normalize(t)
    if key not in seen:
      seen.add(key)
      out.append(t)
  return out


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
  words = normalize(text).split()
  if len(words) < n:  # a short text is one n-gram of itself
    return {tuple(words)} if words else set()
  return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def overlapping(train: Sequence[str], evaluation: Sequence[str], n: int = NGRAM) -> list[int]:
  """Indices of `train` texts that share a word n-gram with an `evaluation` text, or
  contain a whole short one."""
  grams = set().union(*(ngrams(e, n) for e in evaluation)) if evaluation else set()
  short = [normalize(e) for e in evaluation if len(normalize(e).split()) < n]
  out = []
  for i, t in enumerate(train):
    norm = f" {normalize(t)} "
    if ngrams(t, n) & grams or any(f" {s} " in norm for s in short if s):
      out.append(i)
  return out


def read_self_prompts(directory: str) -> list[str]:
  """The usable target-written prompts in directory/self_*.jsonl (shards of
  `lm_decodes.sample_user_turns`), in shard order: turns that ended (not cut by the
  token limit) and pass `clean_self_prompt`, not yet de-duplicated."""
  out = []
  if not os.path.isdir(directory):
    return out
  for name in sorted(os.listdir(directory)):
    if name.startswith("self_") and name.endswith(".jsonl"):
      with open(os.path.join(directory, name), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
      out += [
        t for t in (clean_self_prompt(r["text"]) for r in rows if r["ended"]) if t is not None
      ]
  return out


def training_prompts(
  evaluation: Sequence[str], self_written: Sequence[str] = (), seed: int = 0
) -> list[dict]:
  """Templated and target-written prompts, de-duplicated, interleaved (one
  target-written prompt after each templated one while both last), without any that
  overlaps `evaluation` (`overlapping`)."""
  templated = templated_prompts(seed)
  own = [
    dict(content=t, source="self", category="self", index=i)
    for i, t in enumerate(dedupe(self_written))
  ]
  mixed = [p for pair in itertools.zip_longest(templated, own) for p in pair if p]
  seen, unique = set(), []
  for p in mixed:
    key = normalize(p["content"])
    if key not in seen:
      seen.add(key)
      unique.append(p)
  bad = set(overlapping([p["content"] for p in unique], evaluation))
  return [p for i, p in enumerate(unique) if i not in bad]


# Where --prompt_set=chat's prompts come from, and on what terms (pair.json's
# "provenance" of a draft trained on them).
PROVENANCE = dict(
  templated="instruction templates x topic lists and paragraphs written for specdec "
  "(scripts/research/lm_chat_prompts.py), under the project licence",
  self_written="user turns sampled from HuggingFaceTB/SmolLM2-135M-Instruct "
  "(Apache-2.0) under its own chat template, de-duplicated and filtered",
  eval_sets="specdec/data/eval_sets (PROVENANCE.md there): chat prompts written for "
  "specdec; CNN/DM test articles of the FRANK benchmark (MIT-licensed "
  "collections; article text (c) CNN / Daily Mail, research use); the "
  "shipped draft's 64 evaluation prompts",
  target="HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0",
)


def prompts_words(
  num_templated: int,
  num_self: int,
  num_validation: int,
  eval_counts: dict[str, int],
  max_prompt_tokens: int,
) -> str:
  """The model card's sentence on --prompt_set=chat's prompts."""
  sets = ", ".join(f"{name} ({n})" for name, n in eval_counts.items())
  return (
    f"{num_templated} templated chat prompts (templates x topics written for "
    f"specdec over {len(TEMPLATES)} categories: {', '.join(TEMPLATES)}) and "
    f"{num_self} user turns written by the target itself (sampled under its chat "
    f"template, de-duplicated); {num_validation} more templated prompts validate; "
    f"held-out evaluation sets {sets}, none of whose word {NGRAM}-grams is in a "
    f"training prompt; prompts of at most {max_prompt_tokens} tokens."
  )


@dataclasses.dataclass(frozen=True)
class ChatPrompt:
  """One user message of the chat distribution, as `lm_decodes` reads prompts."""

  content: str
  source: str  # 'templated', 'self', or an evaluation set's name
  category: str  # a `TEMPLATES` key, 'self', or the set's own
  index: int  # in its source's list

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def as_prompts(rows: Sequence[dict], source: str | None = None) -> list[ChatPrompt]:
  return [
    ChatPrompt(
      r["content"], source or r.get("source", ""), str(r.get("category", r.get("source", ""))), i
    )
    for i, r in enumerate(rows)
  ]


def held_out_texts() -> list[str]:
  """Every text no training prompt may hold: the three evaluation sets'
  (`lm_eval_sets`) and the demo's prompts (`specdec.data.lm_prompts.DEMO_PROMPTS`)."""
  import lm_eval_sets

  from specdec.data import lm_prompts

  return [c for name in lm_eval_sets.SETS for c in lm_eval_sets.contents(name)] + list(
    lm_prompts.DEMO_PROMPTS
  )


def chat_split(
  tok,
  max_prompt_tokens: int,
  self_dir: str,
  eval_sets: Sequence[str],
  validation_stride: int = 40,
  seed: int = 0,
) -> dict:
  """The chat prompts of a distillation run: {'train': templated training prompts,
  'validation': every `validation_stride`-th templated prompt, 'self': the
  target-written ones on disk in `self_dir`, 'eval_sets': {name: prompts}}; training
  prompts within `max_prompt_tokens` chat ids and free of every evaluation set's
  text or the demo's (`held_out_texts`, `training_prompts`), whichever sets are
  decoded.

  Raises:
    ValueError: naming validation_stride, when below 2.
  """
  import lm_eval_sets

  from specdec.data import lm_prompts

  if validation_stride < 2:
    raise ValueError(f"validation_stride: must be >= 2, got {validation_stride}")
  evaluation = held_out_texts()
  rows = training_prompts(evaluation, read_self_prompts(self_dir), seed)
  fits = lambda r: len(lm_prompts.encode(tok, r["content"])) <= max_prompt_tokens
  rows = [r for r in rows if fits(r)]
  templated = [r for r in rows if r["source"] == "templated"]
  held = [r for i, r in enumerate(templated) if i % validation_stride == validation_stride - 1]
  train = [r for i, r in enumerate(templated) if i % validation_stride != validation_stride - 1]
  return dict(
    train=as_prompts(train),
    validation=as_prompts(held),
    self=as_prompts([r for r in rows if r["source"] == "self"]),
    eval_sets={name: as_prompts(lm_eval_sets.load(name), name) for name in eval_sets},
  )
