"""The three text domains of the demo model family, offline and deterministic.

- ``code``: Python source of a fixed, sorted list of standard-library modules, read
  from the running interpreter's library folder (identical for one Python version;
  the version is recorded in every model card).
- ``prose``: English text of the Python language and library reference that ships
  with every CPython as ``pydoc_data/topics.py`` (the text ``help()`` shows).
  Technical English, but real human-written prose.
- ``support``: customer-support dialogues from a seeded template generator below:
  intents with slots (names, products, order numbers, dates, carriers), so that the
  agent's reply is largely predictable from the customer's message. That is the
  point of the domain: a small draft tuned to it can predict the target well.

Every domain yields documents; prompts for tuning and benchmarks are cut from
documents that the target was not trained on (other seeds / held-out modules).
"""

from __future__ import annotations

import json
import random
import sys
import sysconfig
from pathlib import Path

__all__ = [
    "CODE_MODULES",
    "HELDOUT_CODE_MODULES",
    "code_documents",
    "code_prompts",
    "prose_documents",
    "prose_prompts",
    "python_version",
    "support_dialogue",
    "support_documents",
    "support_prompts",
    "write_prompts",
]

#: stdlib modules whose source the models are trained on (paths under the lib dir)
CODE_MODULES = (
    "abc.py", "argparse.py", "base64.py", "bisect.py", "calendar.py", "cmd.py", "codecs.py",
    "collections/__init__.py", "colorsys.py", "configparser.py", "contextlib.py", "copy.py",
    "csv.py", "dataclasses.py", "datetime.py", "difflib.py", "enum.py", "filecmp.py",
    "fnmatch.py", "fractions.py", "functools.py", "genericpath.py", "getopt.py", "gettext.py",
    "glob.py", "graphlib.py", "gzip.py", "heapq.py", "hmac.py", "inspect.py", "ipaddress.py",
    "json/__init__.py", "json/decoder.py", "json/encoder.py", "keyword.py", "linecache.py",
    "locale.py", "logging/__init__.py", "mimetypes.py", "numbers.py", "operator.py",
    "optparse.py", "pathlib.py", "pprint.py", "queue.py", "quopri.py", "random.py",
    "reprlib.py", "sched.py", "secrets.py", "selectors.py", "shlex.py", "shutil.py",
    "statistics.py", "string.py", "stringprep.py", "tempfile.py", "textwrap.py",
    "threading.py", "timeit.py", "tokenize.py", "trace.py", "traceback.py", "types.py",
    "typing.py", "uuid.py", "warnings.py", "wave.py", "weakref.py", "zipfile.py",
)
#: modules used only for prompts (never trained on)
HELDOUT_CODE_MODULES = ("ast.py", "cgi.py", "chunk.py", "crypt.py", "dis.py", "imghdr.py", "netrc.py", "plistlib.py")


def python_version() -> str:
    return sys.version.split()[0]


def _lib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def code_documents(modules=CODE_MODULES) -> list[str]:
    """Source text of each module that exists in this Python (sorted order kept)."""
    docs = []
    for rel in modules:
        path = _lib_dir() / rel
        if path.is_file():
            docs.append(path.read_text(encoding="utf-8", errors="replace"))
    return docs


def _prose_topics() -> list[tuple[str, str]]:
    from pydoc_data import topics

    return sorted(topics.topics.items())


def prose_documents(held_out_every: int = 10) -> list[str]:
    """Reference topics, except every ``held_out_every``-th (kept for prompts)."""
    return [text for i, (_, text) in enumerate(_prose_topics()) if i % held_out_every != 0]


# ------------------------------------------------------------------ support

_FIRST = ("Anna", "Ben", "Carla", "David", "Emma", "Felix", "Grace", "Hugo", "Ines", "Jonas",
          "Karin", "Leo", "Maya", "Noah", "Olga", "Paul", "Rosa", "Sam", "Tara", "Victor")
_PRODUCTS = ("blue kettle", "desk lamp", "coffee grinder", "wireless mouse", "yoga mat",
             "rain jacket", "phone case", "water bottle", "travel mug", "bluetooth speaker",
             "office chair", "backpack", "toaster", "hair dryer", "keyboard", "monitor stand")
_CARRIERS = ("DHL", "UPS", "FedEx", "Royal Mail", "PostNL")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
_PLANS = ("Basic", "Plus", "Premium", "Family")
_COMPANY = "Acme Shop"

# intent -> (customer message templates, agent reply template, closing of the customer)
_INTENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "late": (
        ("I ordered a {product} on {date} (order #{order}) and it has not arrived yet.",
         "My order #{order} for a {product} is late. Where is my delivery?",
         "My {product} from order #{order} still has not been delivered. Can you help?"),
        "I'm sorry that your {product} has not arrived yet, {name}. I checked order #{order}: "
        "it was shipped with {carrier} and should arrive within {days} business days. "
        "You will receive a tracking link by email today.",
    ),
    "refund": (
        ("I want a refund for my {product}, order #{order}.",
         "Can I get my money back for the {product} I bought? The order number is #{order}.",
         "Please refund order #{order}, the {product} is not what I expected."),
        "Of course, {name}. I have started a refund for your {product} (order #{order}). "
        "The amount of ${price} will be returned to your original payment method within "
        "{days} business days. You do not need to send the item back.",
    ),
    "damaged": (
        ("My {product} arrived damaged. Order #{order}.",
         "The {product} from order #{order} was broken when it arrived.",
         "The box was crushed and my {product} is damaged, order #{order}."),
        "I'm very sorry that your {product} arrived damaged, {name}. I have sent a free "
        "replacement for order #{order}; it will ship with {carrier} within {days} business "
        "days. Please keep the damaged item until the replacement arrives.",
    ),
    "password": (
        ("I cannot log in to my account, I forgot my password.",
         "How do I reset my password? My email is {email}.",
         "My password does not work anymore and I am locked out."),
        "No problem, {name}. I have sent a password reset link to {email}. The link is valid "
        "for 24 hours. If you do not see the email, please check your spam folder.",
    ),
    "address": (
        ("I need to change the delivery address for order #{order}.",
         "I moved. Can you send order #{order} to my new address?",
         "Can I update the shipping address of my order #{order}?"),
        "Sure, {name}. Order #{order} has not shipped yet, so I can still change the address. "
        "Please reply with the new address and I will update it right away.",
    ),
    "cancel": (
        ("I want to cancel my {plan} subscription.",
         "Please cancel my {plan} plan, I do not use it anymore.",
         "How do I stop my {plan} subscription?"),
        "I have cancelled your {plan} subscription, {name}. You can keep using it until "
        "the end of the current billing period on {month} {day}. You will not be charged again.",
    ),
    "billing": (
        ("Why was I charged ${price} twice this month?",
         "I see two charges of ${price} on my card. Is that a mistake?",
         "I was billed ${price} two times for my {plan} plan."),
        "I'm sorry for the confusion, {name}. I checked your account: the second charge of "
        "${price} was a duplicate. I have refunded it, and it will appear on your statement "
        "within {days} business days.",
    ),
    "warranty": (
        ("My {product} stopped working after {months} months. Is it under warranty?",
         "Is my {product} still covered by the warranty? I bought it {months} months ago.",
         "The {product} I bought {months} months ago is broken. What can I do?"),
        "Yes, {name}, your {product} is covered by our two-year warranty. I have created a "
        "repair ticket for you. Please print the return label from your email and send the "
        "{product} back to us.",
    ),
}

_GREETING = "Agent: Hello, thank you for contacting {company} support. My name is {agent}. How can I help you today?"
_CLOSING = ("Customer: Thank you, that helps.",
            "Agent: You're welcome, {name}! Is there anything else I can help you with?",
            "Customer: No, that's all.",
            "Agent: Thank you for contacting {company} support. Have a great day!")


def _slots(rng: random.Random) -> dict[str, str]:
    name = rng.choice(_FIRST)
    return {
        "name": name,
        "agent": rng.choice(_FIRST),
        "product": rng.choice(_PRODUCTS),
        "order": str(rng.randint(10000, 99999)),
        "date": f"{rng.choice(_MONTHS)} {rng.randint(1, 28)}",
        "carrier": rng.choice(_CARRIERS),
        "days": str(rng.randint(2, 7)),
        "price": f"{rng.randint(5, 199)}.{rng.choice(('00', '50', '99'))}",
        "email": f"{name.lower()}{rng.randint(1, 99)}@example.com",
        "plan": rng.choice(_PLANS),
        "month": rng.choice(_MONTHS),
        "day": str(rng.randint(1, 28)),
        "months": str(rng.randint(3, 20)),
        "company": _COMPANY,
    }


def support_dialogue(rng: random.Random) -> tuple[str, str]:
    """One dialogue, split as (prompt up to the agent's answer, the rest)."""
    intent = rng.choice(sorted(_INTENTS))
    customer, reply = _INTENTS[intent]
    slots = _slots(rng)
    prompt = "\n".join((
        _GREETING.format(**slots),
        f"Customer: Hi, this is {slots['name']}. " + rng.choice(customer).format(**slots),
        "Agent:",
    ))
    rest = " " + reply.format(**slots) + "\n" + "\n".join(line.format(**slots) for line in _CLOSING)
    return prompt, rest


def support_documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(support_dialogue(rng)) for _ in range(n)]


# ------------------------------------------------------------------ prompts


def support_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [support_dialogue(rng)[0] for _ in range(n)]


def code_prompts(n: int, seed: int, chars: int = 300) -> list[str]:
    """Openings of ``def`` blocks (with what precedes them) from held-out modules."""
    rng = random.Random(seed)
    candidates = []
    for text in code_documents(HELDOUT_CODE_MODULES):
        lines = text.splitlines(keepends=True)
        for i, line in enumerate(lines):
            if line.lstrip().startswith("def ") and i >= 2:
                head = "".join(lines[i:i + 3])
                candidates.append(head[:chars])
    rng.shuffle(candidates)
    return candidates[:n]


def prose_prompts(n: int, seed: int, chars: int = 300, held_out_every: int = 10) -> list[str]:
    """Paragraph openings from the reference topics the models were not trained on."""
    rng = random.Random(seed)
    paragraphs = []
    for i, (_, text) in enumerate(_prose_topics()):
        if i % held_out_every:
            continue
        for para in text.split("\n\n"):
            para = " ".join(para.split())
            if len(para) > 200 and not para.startswith(("*", "-", ">>>", "=")):
                paragraphs.append(para[:chars].rsplit(" ", 1)[0])
    rng.shuffle(paragraphs)
    return paragraphs[:n]


def write_prompts(path: str | Path, prompts_by_domain: dict[str, list[str]]) -> Path:
    """JSONL, one ``{"domain": ..., "prompt": ...}`` per line (the format of
    ``accel tune-draft --prompts`` and ``accel bench acceptance --prompts``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for domain, prompts in prompts_by_domain.items():
            for p in prompts:
                f.write(json.dumps({"domain": domain, "prompt": p}) + "\n")
    return path
