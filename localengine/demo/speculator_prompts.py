"""Instructions for training an instruct model's MLP speculator on its own answers.

A speculator learns the phrasing of the answers it is trained on, so the prompts should be as varied
as what users ask: open questions (task templates x topics), and input-grounded work on text that
ships with Python (explain, edit or document a standard-library function; summarise, quote or
rewrite a module's docstring). Nothing here is downloaded. The speculation benchmark's own prompts
(bench/localengine/spec_decode.py: a refrigerator question, a `moving_average` function, a
lighthouse paragraph) are none of these.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

TASKS = ["Write a short story about {}.", "Explain {} to a ten-year-old.", "List five facts about {}.",
         "Write a short poem about {}.", "What are the advantages and disadvantages of {}?",
         "Give me three practical tips about {}.", "Write a short email inviting a friend to talk about {}.",
         "Describe {} in one paragraph.", "Write a blog post introduction about {}.", "Why does {} matter?",
         "Summarize what you know about {}.", "Write a haiku about {}.", "What is the history of {}?",
         "How would you teach a beginner about {}?", "Write a short dialogue between two friends about {}.",
         "What are common misconceptions about {}?", "Write a short product description related to {}.",
         "Give step-by-step instructions for getting started with {}.",
         "Write a motivational message that mentions {}.", "Ask me five quiz questions about {}, with answers."]
# Question forms users type without a template's framing.
MORE_TASKS = ["How does {} work?", "What is {}?", "Explain {}.", "Tell me about {}.", "Can you explain {} simply?",
              "What should I know about {}?", "Why do people care about {}?", "How is {} used today?",
              "What are the main parts of {}?", "Write a paragraph about {} for a school report.",
              "What are three surprising things about {}?", "How has {} changed over time?",
              "What problems does {} solve?", "Give an example that explains {}.",
              "Write a short speech about {}.", "What would happen without {}?", "How do I explain {} to my parents?",
              "Write a tweet about {}.", "What are the risks of {}?", "Compare {} with something similar."]
TOPICS = ["the ocean", "gardening", "electric cars", "the moon", "coffee", "learning a language", "volcanoes",
          "friendship", "recycling", "chess", "bees", "the internet", "mountains", "rainy days", "bicycles",
          "the human heart", "photography", "saving money", "dinosaurs", "music lessons", "trains", "deserts",
          "healthy breakfasts", "the solar system", "libraries", "winter", "robots", "forests", "cooking pasta",
          "public speaking", "penguins", "clocks", "football", "clouds", "writing letters", "bridges", "honey",
          "sleep", "maps", "a small bakery", "time management", "lighthouses", "rivers", "video games",
          "painting", "the history of paper", "camping", "kindness", "airplanes", "tea", "volleyball", "glaciers",
          "owls", "baking bread", "solar panels", "meditation", "ancient Egypt", "the stock market", "origami",
          "spiders", "hiking", "typewriters", "wind turbines", "jazz", "the Roman empire", "vaccines", "sharks",
          "board games", "snowflakes", "the printing press", "tomatoes", "rainforests", "electric guitars", "yoga",
          "submarines", "cheese", "the Olympic games", "butterflies", "smartphones", "castles", "earthquakes",
          "knitting", "elephants", "street food", "newspapers", "hot air balloons", "first aid", "coral reefs",
          "skateboarding", "the alphabet", "telescopes", "mushrooms", "marathons", "chocolate", "comets",
          "pottery", "wolves", "umbrellas", "podcasts", "bamboo"]
MORE_TOPICS = [
    # science and nature
    "photosynthesis", "black holes", "the water cycle", "DNA", "gravity", "magnets", "rainbows", "tides",
    "the immune system", "evolution", "atoms", "electricity", "sound waves", "the speed of light", "climate change",
    "the ozone layer", "fossils", "the periodic table", "bacteria", "the human brain", "muscles", "bones",
    "the digestive system", "hurricanes", "lightning", "the seasons", "ocean currents", "soil", "pollination",
    "migratory birds", "octopuses", "whales", "ants", "frogs", "cats", "dogs", "horses", "trees in autumn",
    "cactus plants", "the northern lights", "Mars", "Jupiter", "the sun", "satellites", "the Big Bang",
    "nuclear energy", "batteries", "steam engines", "microscopes", "chemical reactions", "friction",
    # technology and computing
    "cloud computing", "databases", "passwords", "encryption", "open source software", "web browsers",
    "search engines", "machine learning", "computer viruses", "email", "the Python programming language",
    "version control with git", "spreadsheets", "3D printing", "virtual reality", "GPS", "Wi-Fi", "USB drives",
    "operating systems", "computer memory", "unit testing", "APIs", "websites", "online privacy",
    "social media", "video calls", "digital cameras", "self-driving cars", "drones", "electric scooters",
    "smart homes", "QR codes", "barcodes", "the keyboard", "programming for kids", "debugging code",
    "data backups", "command line tools", "JSON files", "regular expressions",
    # daily life, work and society
    "budgeting", "job interviews", "working from home", "moving to a new city", "learning to drive",
    "grocery shopping", "cooking rice", "making soup", "houseplants", "cleaning the kitchen", "laundry",
    "morning routines", "drinking water", "running shoes", "stretching", "team work", "leadership",
    "customer service", "starting a small business", "taxes", "insurance", "renting an apartment",
    "buying a used car", "public transport", "traffic lights", "elections", "volunteering", "museums",
    "zoos", "theme parks", "weddings", "birthday parties", "holidays abroad", "packing a suitcase",
    "learning to swim", "playing the piano", "drawing portraits", "writing a novel", "reading habits",
    "note taking", "studying for exams", "online courses", "homework", "teachers", "parenting",
    "grandparents", "pets", "neighbours", "city parks", "farmers markets", "food waste", "composting",
    "plastic pollution", "clean water", "electric bills", "saving energy at home",
    # history, culture and arts
    "the Renaissance", "the Industrial Revolution", "ancient Greece", "the Vikings", "the Silk Road",
    "the Great Wall of China", "the pyramids", "medieval knights", "the moon landing", "the telephone",
    "the invention of the wheel", "the history of money", "Shakespeare", "classical music", "ballet",
    "street art", "film making", "comic books", "folk tales", "poetry", "sculpture", "architecture",
    "famous inventors", "world languages", "sign language", "calendars", "the history of the bicycle",
    "the history of chess", "festivals around the world", "traditional clothing", "spices", "bread around the world",
    "rice dishes", "ice cream", "pizza", "sushi", "olive oil", "apples", "bananas", "potatoes",
    # sport and health
    "tennis", "basketball", "swimming", "cycling races", "rock climbing", "skiing", "surfing", "boxing",
    "table tennis", "running a first 5k", "healthy snacks", "vitamins", "sleep hygiene", "stress",
    "dental care", "sunscreen", "washing hands", "posture", "walking every day", "breathing exercises",
]


def stdlib_sources(seed: int) -> list[tuple[str, str]]:
    """(module name, source) of the standard library's top-level modules, in a fixed random order."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    random.Random(seed).shuffle(files)
    return [(f.stem, f.read_text(encoding="utf-8", errors="ignore")) for f in files]


def functions(source: str, min_lines: int = 4, max_lines: int = 30) -> list[tuple[str, list[str]]]:
    """(source text, local variable names) of the module's functions and methods of a readable size."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines()
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.end_lineno is None:
            continue
        if not min_lines <= node.end_lineno - node.lineno + 1 <= max_lines:
            continue
        body = lines[node.lineno - 1 : node.end_lineno]
        indent = len(body[0]) - len(body[0].lstrip())
        names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
        out.append(("\n".join(line[indent:] for line in body), names))
    return out


def docstrings(source: str, min_chars: int = 200, max_chars: int = 1200) -> list[str]:
    """Prose paragraphs of the module's docstrings (module, classes, functions)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
            doc = ast.get_docstring(node)
            for para in (doc or "").split("\n\n"):
                para = " ".join(para.split())
                if min_chars <= len(para) <= max_chars and ">>>" not in para:
                    out.append(para)
    return out


CODE_TASKS = ["Explain what this Python function does.\n\n{code}",
              "Add type hints to this function. Reply with the code only.\n\n{code}",
              "Write a docstring for this function.\n\n{code}",
              "Rewrite this function with the variable `{old}` renamed to `{new}`. Reply with the code only.\n\n{code}",
              "Write a unit test for this function.\n\n{code}",
              "Is there a bug in this function? Explain briefly.\n\n{code}",
              "Add comments to this function. Reply with the code only.\n\n{code}"]
TEXT_TASKS = ["Summarize this text in two sentences.\n\n{text}",
              "Repeat the following paragraph exactly, then add one sentence of your own.\n\n{text}",
              "List the key points of this text.\n\n{text}",
              "Rewrite this paragraph in simpler words.\n\n{text}",
              "What is this text about?\n\n{text}",
              "Quote the first sentence of this text, then explain it.\n\n{text}"]
NEW_NAMES = ["result", "value", "items", "count", "index", "data", "output", "total_size", "current", "buffer"]


def instructions(count: int, seed: int = 1) -> list[str]:
    """`count` user messages: open questions (task x topic) for 60%, the rest input-grounded work on
    standard-library functions and docstrings, shuffled with a fixed seed."""
    rng = random.Random(seed)
    topics, tasks = TOPICS + MORE_TOPICS, TASKS + MORE_TASKS
    pairs = [(task, topic) for task in tasks for topic in topics]
    rng.shuffle(pairs)
    n_open = min(len(pairs), int(count * 0.6))
    out = [task.format(topic) for task, topic in pairs[:n_open]]
    funcs, texts = [], []
    for _, source in stdlib_sources(seed):
        funcs += functions(source)
        texts += docstrings(source)
        if len(funcs) > 4 * count and len(texts) > 4 * count:
            break
    rng.shuffle(funcs)
    rng.shuffle(texts)
    n_code = (count - n_open) * 5 // 8
    for i, (code, names) in enumerate(funcs[:n_code]):
        task = CODE_TASKS[i % len(CODE_TASKS)]
        if "{old}" in task and not names:
            task = CODE_TASKS[0]
        old = rng.choice(names) if names else ""
        out.append(task.format(code=code, old=old, new=rng.choice([n for n in NEW_NAMES if n != old])))
    for i, text in enumerate(texts[: count - len(out)]):
        out.append(TEXT_TASKS[i % len(TEXT_TASKS)].format(text=text))
    rng.shuffle(out)
    return out
