"""Prompts of the SmolLM2 demo family: user messages in three domains, seeded.

Writes ``prompts/{support,code,general}-tune.jsonl`` (for ``accel tune-draft``) and
``prompts/{support,code,general}-heldout.jsonl`` (the demo, ``accel tune-draft
--held-out``, ``accel bench acceptance``). Each line is a user message; the demo and
``accel tune-draft --chat`` wrap it in the target's chat template.

Held-out prompts are built from other phrasings and other slot values than the
tuning prompts, and any held-out prompt that still shares an 8-token sequence
(target tokenizer) with a tuning prompt is dropped; tests/tuning/test_smollm2_family.py
checks the property on the committed files.

    .venv/bin/python demo_models/smollm2/make_prompts.py --tokenizer ~/.cache/accel-plugin/models/smollm2/hf
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
NGRAM = 8
TUNE_PER_DOMAIN = 320
BENCH_PER_DOMAIN = 24

# ------------------------------------------------------------------ support

#: customer intents, each in several phrasings: the first ones are for tuning, the
#: last one only for held-out prompts (same needs, other words, as in real traffic).
#: Slots: {product} {order} {amount} {days} {carrier} {plan}
_SUPPORT_INTENTS = [
    ("My order #{order} has not arrived yet. What can I do?",
     "Where is my package? I ordered it {days} days ago and nothing came.",
     "I'm still waiting for order #{order}. When will it be delivered?",
     "My delivery is late. Can you check on order #{order} for me?",
     "Hello, it has been {days} days and package {order} is still not here, please help."),
    ("I want to return the {product} I bought last week. How does that work?",
     "How can I send back a {product} that I don't need anymore?",
     "What is your return policy? I'd like to give back my {product}.",
     "Can I return an unopened {product} for a full refund?",
     "Where do I send the {product} back if it does not fit?"),
    ("I was charged {amount} twice for order #{order}. Can you fix this?",
     "There is a double charge of {amount} on my card from your shop.",
     "You billed me {amount} two times. Please refund one of them.",
     "My bank shows the same payment of {amount} twice. What happened?",
     "Could you explain why there are two identical payments of {amount} on my statement?"),
    ("The {product} I received is broken. Can I get a replacement?",
     "My new {product} came broken. I want a new one.",
     "The {product} doesn't work out of the box. What should I do?",
     "I just unpacked my {product} and it is defective.",
     "Please help, the {product} you sent me does not turn on at all."),
    ("How do I cancel my {plan} subscription?",
     "Please cancel my {plan} plan, I don't use it anymore.",
     "I want to end my {plan} subscription today.",
     "What are the steps to unsubscribe from {plan}?",
     "I'd like to stop my {plan} membership from renewing next month."),
    ("Can I change the shipping address for order #{order}?",
     "I moved last week. Can you send order #{order} to my new address?",
     "I typed the wrong address for order #{order}. Can you correct it?",
     "Please update the delivery address on my order before it ships.",
     "Is it too late to edit where shipment {order} gets delivered?"),
    ("My package was marked as delivered but I never got it.",
     "The tracking says delivered, but there is no parcel at my door.",
     "{carrier} says my order was delivered yesterday. I don't have it.",
     "My order shows as delivered but nothing arrived. Can you help?",
     "Your courier {carrier} left my parcel at the wrong house. What now?"),
    ("I forgot my password and cannot log in to my account.",
     "I can't sign in anymore, the password reset email never arrives.",
     "How do I reset my password? The login page keeps saying it's wrong.",
     "My account is locked and I can't get into it.",
     "Locked out of my account after too many attempts, how do I get back in?"),
    ("When will my refund for the {product} show up on my card?",
     "You approved my refund {days} days ago but I still don't see the money.",
     "How long do refunds take? I sent back the {product} last week.",
     "I'm waiting for my refund of {amount}. Is there an update?",
     "How many business days until the money for my returned {product} is back?"),
    ("I received the wrong item. I ordered a {product} but got something else.",
     "The box had someone else's order in it instead of my {product}.",
     "You sent me the wrong size and the wrong color. What now?",
     "This is not what I ordered. I wanted a {product}.",
     "You sent me a completely different product than the {product} on my receipt."),
    ("Can I upgrade my plan from {plan} to a higher tier?",
     "What does it cost to move from {plan} to your best plan?",
     "How do I switch my account to the {plan} plan?",
     "Is there a discount if I upgrade to {plan} for a whole year?",
     "I want more features than {plan} gives me. What are my options?"),
    ("I need an invoice for order #{order} for my company.",
     "Can you email me a receipt with VAT for order #{order}?",
     "Where can I download the invoice for my last purchase?",
     "Please send a copy of the receipt for order #{order}.",
     "Our accounting team asks for a proper bill for shipment {order}."),
    ("The discount code I entered was not applied to my order.",
     "My coupon did not work at checkout and I paid full price.",
     "The promo code says it is invalid, but it should still be valid.",
     "I forgot to enter my discount code. Can you still apply it?",
     "Why didn't the promo code reduce my total? I still got billed {amount}."),
    ("My {product} stopped working after {days} days. Is it still under warranty?",
     "Does the warranty cover a {product} that broke after {days} days?",
     "How long is the warranty on the {product}?",
     "My {product} has a defect. Can I use the warranty to get it fixed?",
     "The {product} died after {days} days of normal use, will you repair it?"),
    ("I would like to speak to a manager about my last order.",
     "This is my third complaint. Please escalate my case to a supervisor.",
     "I am not happy with the service so far. Who can I talk to?",
     "Can I get a phone number to call your customer service?",
     "Can someone senior call me back? Nobody answers the chat."),
    ("The {product} arrived damaged because the box was crushed.",
     "The parcel from {carrier} was crushed and the {product} inside is dented.",
     "My {product} was damaged during shipping. Can I get a new one?",
     "The package was wet and the {product} is ruined.",
     "What is your policy when an item shows up scratched, like my {product}?"),
    ("I was billed for {plan} even though I cancelled last month.",
     "Why do you still charge me for {plan}? I ended it already.",
     "I see a charge of {amount} for a subscription I cancelled.",
     "Please refund the last {plan} payment, I had already cancelled.",
     "I never signed up for {plan}, so why am I paying for it?"),
    ("Part of my order is missing: the {product} was not in the box.",
     "Order #{order} came without the {product}. Where is it?",
     "I only received one of the two items I ordered.",
     "My package arrived but the {product} is not inside.",
     "Hi there, only half of shipment {order} arrived and the {product} is missing."),
    ("Do you ship to Canada, and how long does it take?",
     "How much does shipping to Germany cost?",
     "Can I get express delivery for my {product}?",
     "Which countries do you deliver to?",
     "Is international delivery possible for a {product}, and what are the fees?"),
    ("How do I delete my account and all my data?",
     "Please remove my personal data from your systems.",
     "I want to close my account permanently.",
     "Can you tell me what data you store about me?",
     "Erase everything you have on file about me and shut down my profile, please."),
]
_PRODUCTS = ["headphones", "coffee maker", "backpack", "desk lamp", "phone case", "blender", "keyboard",
             "rain jacket", "water bottle", "smart watch", "office chair", "toaster", "yoga mat",
             "electric kettle", "gaming mouse", "winter boots", "air fryer", "sunglasses"]
_CARRIERS = ["UPS", "FedEx", "DHL", "USPS", "Royal Mail"]
_PLANS = ["Premium", "Family", "Pro", "Gold", "Student"]
_SUPPORT = {"tune": [p for intent in _SUPPORT_INTENTS for p in intent[:-1]],
            "bench": [intent[-1] for intent in _SUPPORT_INTENTS]}

#: more tuning phrasings of the same 20 needs, in the order of :data:`_SUPPORT_INTENTS`
#: (issue 23: the support draft matched the target on 0.79 of its tuning answers and
#: 0.52 of held-out ones; more ways of asking, not more slot values, is what it lacked).
#: They make :data:`EXTRA_TUNE` more tuning prompts from a generator of their own, so
#: the held-out files do not change; one sharing an 8-token sequence with any held-out
#: prompt is dropped.
_SUPPORT_MORE = [
    ("Any news on order #{order}? The tracking has not moved for {days} days.",
     "My parcel still has not shown up. Could you look into order #{order}?",
     "It says my {product} was shipped, but it never reached me. Can you check?"),
    ("I changed my mind about the {product}. Can I send it back?",
     "Is it possible to return a {product} after {days} days?",
     "The {product} is not what I expected, and I would like to return it."),
    ("Why was my card debited {amount} two times for one purchase?",
     "I paid {amount} for order #{order} and the charge appears twice.",
     "Your store took {amount} from my account twice. I want my money back."),
    ("The screen of my {product} is cracked and it came like that.",
     "My {product} arrived today and it will not work at all.",
     "Half of the buttons on the {product} are not working. Can you replace it?"),
    ("Stop my {plan} subscription, please. I don't want to pay for it anymore.",
     "How can I turn off the automatic renewal of my {plan} plan?",
     "I would like to cancel {plan} before the next billing date."),
    ("I need to ship order #{order} to a different address. Is that possible?",
     "Could you redirect my parcel to my office instead of my home?",
     "There is a typo in my street name on order #{order}. Please fix it."),
    ("The app says my {product} was delivered, but my mailbox is empty.",
     "{carrier} marked order #{order} as delivered and I have nothing.",
     "My neighbor did not get my package either. It says delivered. What should I do?"),
    ("The reset link you send me has expired. How can I log in?",
     "I changed my email and now I cannot access my account.",
     "Your site keeps telling me my password is incorrect. Please help me log in."),
    ("It has been {days} days since I returned the {product}. Where is my refund?",
     "The refund of {amount} still is not on my credit card. Can you check?",
     "When do I get my money back for the {product} I sent back?"),
    ("I got a {product} that I never ordered. What should I do with it?",
     "My order #{order} contains the wrong product.",
     "The item in my package is not the {product} I paid for."),
    ("What do I get if I move from {plan} to the next plan?",
     "Can I try the plan above {plan} for a month before I pay?",
     "Please upgrade my account from {plan}. How much more is it per month?"),
    ("Can I get an invoice with my company name for order #{order}?",
     "I lost the receipt for my {product}. Can you send a new one?",
     "How do I get a PDF invoice for the {amount} I paid?"),
    ("My promo code expired yesterday. Can I still use it?",
     "Can you add the discount I forgot to my order #{order}?",
     "The checkout did not take my coupon and charged me {amount}."),
    ("Is my {product} still covered? It broke after {days} days.",
     "What does the warranty of the {product} include?",
     "The {product} stopped charging. Can you repair it under the warranty?"),
    ("I want to file a complaint. Who is in charge of customer service?",
     "Please have a manager contact me about order #{order}.",
     "Nobody has solved my problem yet. I want to talk to someone in charge."),
    ("The box was torn open and my {product} is scratched.",
     "{carrier} delivered my {product} with a big dent in it.",
     "My {product} came broken because it was packed badly. What can you do?"),
    ("You charged me {amount} for {plan} after I cancelled it.",
     "I cancelled {plan} but I was still billed this month.",
     "Please stop charging me for {plan}, I cancelled it weeks ago."),
    ("The {product} was missing from my package. Can you send it?",
     "Order #{order} is incomplete, one item is not in the box.",
     "I got my order but the {product} was not included."),
    ("Do you deliver to the United Kingdom? How long does it take?",
     "What are the shipping costs to Australia for a {product}?",
     "Can I order from outside the country, and how much does delivery cost?"),
    ("How do I remove my account and everything you know about me?",
     "I want you to delete all my personal information.",
     "Please close my account and delete my order history."),
]
assert len(_SUPPORT_MORE) == len(_SUPPORT_INTENTS)
#: tuning prompts from :data:`_SUPPORT_MORE`, added to the 320 of ``support-tune.jsonl``
EXTRA_TUNE = {"support": 480}


def _fill(template: str, rng: random.Random) -> str:
    """A support template with its slots drawn from ``rng``."""
    return template.format(
        product=rng.choice(_PRODUCTS),
        order=rng.randrange(10000, 99999),
        amount=f"${rng.randrange(5, 300)}.{rng.randrange(0, 100):02d}",
        days=rng.randrange(3, 40),
        carrier=rng.choice(_CARRIERS),
        plan=rng.choice(_PLANS),
    )


def _support_more(rng: random.Random, part: str) -> str:
    return _fill(rng.choice([p for more in _SUPPORT_MORE for p in more]), rng)


def _support(rng: random.Random, part: str) -> str:
    return _fill(rng.choice(_SUPPORT[part]), rng)


# --------------------------------------------------------------------- code

_CODE_TASKS = {
    "tune": [
        "reverses a string", "checks whether a number is prime", "returns the factorial of n",
        "computes the n-th Fibonacci number", "counts the vowels in a string", "removes duplicates from a list",
        "finds the largest element of a list", "merges two sorted lists", "checks whether a string is a palindrome",
        "returns the sum of the digits of an integer", "converts Celsius to Fahrenheit", "flattens a nested list",
        "counts how often each word appears in a text", "returns the second largest number in a list",
        "checks whether two strings are anagrams", "computes the greatest common divisor of two numbers",
        "sorts a list of dictionaries by a key", "reads a text file and returns its lines",
        "returns the average of a list of numbers", "capitalizes the first letter of every word",
        "finds all even numbers in a list", "computes the power set of a list", "transposes a matrix",
        "checks whether a year is a leap year", "converts a binary string to an integer",
        "returns the intersection of two lists", "implements binary search", "computes the mean and median",
        "validates an email address with a regular expression", "chunks a list into pieces of size n",
    ],
    "bench": [
        "rotates a list by k positions", "returns the longest word in a sentence",
        "computes the least common multiple of two integers", "checks whether brackets in a string are balanced",
        "converts a Roman numeral to an integer", "groups a list of strings by their length",
        "returns the running total of a list", "counts the number of set bits in an integer",
    ],
}
_CODE_FORMS = {
    "tune": ["Write a Python function that {task}.", "How do I write a function in Python that {task}?",
             "Show me Python code that {task}.", "Implement a Python function which {task}, with a docstring."],
    "bench": ["Give an example of a Python function that {task}.", "I need a small Python helper that {task}, please."],
}

# ------------------------------------------------------------------ general

_GENERAL_TOPICS = {
    "tune": ["photosynthesis", "gravity", "the water cycle", "inflation", "democracy", "black holes", "vaccines",
             "the internet", "climate change", "the French Revolution", "volcanoes", "electricity", "DNA",
             "the stock market", "renewable energy", "the immune system", "earthquakes", "the Roman Empire",
             "machine learning", "the moon landing", "plate tectonics", "the printing press", "rainbows"],
    "bench": ["tides", "the Silk Road", "antibiotics", "solar eclipses", "supply and demand", "coral reefs"],
}
_GENERAL_ACTIVITIES = {
    "tune": ["sleeping better", "learning a new language", "saving money", "staying focused", "running a marathon",
             "cooking healthy meals", "public speaking", "growing tomatoes", "reducing stress", "writing an essay"],
    "bench": ["keeping houseplants alive", "preparing for a job interview", "travelling on a budget"],
}
_GENERAL_FORMS = {
    "tune": ["Explain {topic} in simple terms.", "What is {topic}?", "Give me three tips for {activity}.",
             "Write a short paragraph about {topic}.", "What are the benefits of {activity}?"],
    "bench": ["Could you describe how {topic} works to a child?", "Tell me a few facts about {topic}.",
              "What should a beginner know about {activity}?"],
}


_STYLES = {
    "code": {"tune": ["", " Use a loop.", " Add type hints.", " Keep it short."],
             "bench": ["", " Explain each step briefly.", " Make it work for empty input too."]},
    "general": {"tune": ["", " Keep it brief.", " Use an example.", " Answer in two sentences."],
                "bench": ["", " Please be concrete.", " I am new to this."]},
}


def _code(rng: random.Random, part: str) -> str:
    return (rng.choice(_CODE_FORMS[part]).format(task=rng.choice(_CODE_TASKS[part]))
            + rng.choice(_STYLES["code"][part]))


def _general(rng: random.Random, part: str) -> str:
    return (rng.choice(_GENERAL_FORMS[part]).format(
        topic=rng.choice(_GENERAL_TOPICS[part]), activity=rng.choice(_GENERAL_ACTIVITIES[part]))
        + rng.choice(_STYLES["general"][part]))


# ------------------------------------------------- support, free-style (held-out only)

#: the same kind of needs as _SUPPORT_INTENTS, written as customers write them: not
#: templated sentences but chat fragments, each need in its own words (none of these
#: phrasings is a tuning phrasing). {order} here is a customer-typed order reference.
_FREESTYLE_NEEDS = [
    "where is my stuff?? {order} still says processing after {days} days",
    "ordered a {product} on the {days}th and still nothing, tracking link is dead",
    "got charged {amount} 2x for {order}, pls refund the extra one",
    "my card got hit twice with {amount} for the same order, whats going on",
    "need to send the {product} back, it's way too small. how do i do that",
    "can i still return my {product} if i threw away the box",
    "the {product} is dead on arrival, wont even power up",
    "{product} arrived cracked down the middle, want a new one asap",
    "stop charging me for {plan}!! i cancelled weeks ago",
    "how do i get out of the {plan} thing, cant find a cancel button anywhere",
    "{carrier} app says delivered but my porch is empty",
    "tracking for {order} shows delivered at 2pm, nobody was home and there's nothing here",
    "cant log in, reset link just sends me in a loop",
    "my acount is locked and the support chat bot keeps going in circles",
    "returned the {product} ages ago and still no money back, was {amount}",
    "refund for {order} was promised {days} days ago, bank shows nothing",
    "box came with a {product} in the wrong colour and someone elses receipt",
    "i got 2 left shoes lol, {order}",
    "the promo code SAVE20 keeps saying expired but your email said its good till friday",
    "forgot the coupon at checkout, paid {amount}, can u take it off",
    "need a proper invoice w/ my company name for {order}, accounting wants it",
    "{product} stopped charging after {days} days, is that covered or not",
    "moving house next week, can {order} go to my new place instead",
    "typo in my street name on {order} :( can u change it before it ships",
    "half my order is missing, the {product} wasnt in there",
    "do u ship to ireland and how much",
    "want all my data deleted, and close the account too",
    "thinking about going from {plan} to the yearly one, whats the price diff",
]
_FREESTYLE_ORDERS = ["ord {a}-{b}", "#A{n}", "order no. {n}", "ORD-{n}", "order nr {a}{b}", "#{n}", "{a}-{b}"]
_FREESTYLE_OPEN = ["", "", "hi, ", "hello ", "hey there. ", "good morning, ", "hi team, ", "HELLO? "]
_FREESTYLE_JOIN = [". also ", " and also ", "? btw ", ". oh and ", " - also "]
_FREESTYLE_CLOSE = ["", "", " thanks", " thx", " cheers, dana", " - mike", " regards, J. Ortiz", " ty!!", " asap please"]
#: typos customers make (applied to some of the words)
_TYPOS = {"received": "recieved", "package": "pakage", "please": "plz", "the": "teh", "because": "becuase",
          "address": "adress", "again": "agian", "really": "realy", "weeks": "wekes", "still": "stil",
          "nothing": "nothin", "which": "wich", "days": "dyas", "what": "wat"}


def _support_freestyle(rng: random.Random, part: str) -> str:
    """A support message as customers type it: a greeting or not, one or two needs in
    one run-on message, typed order numbers, typos, mostly lower case, a sign-off."""
    if part != "bench":
        raise ValueError("the free-style support set is held-out only")

    def need() -> str:
        order = rng.choice(_FREESTYLE_ORDERS).format(a=rng.randrange(10, 99), b=rng.randrange(1000, 9999),
                                                     n=rng.randrange(10000, 99999))
        return rng.choice(_FREESTYLE_NEEDS).format(
            product=rng.choice(_PRODUCTS), order=order, days=rng.randrange(3, 40), carrier=rng.choice(_CARRIERS),
            plan=rng.choice(_PLANS), amount=f"${rng.randrange(5, 300)}.{rng.randrange(0, 100):02d}")

    text = need()
    if rng.random() < 0.4:
        text += rng.choice(_FREESTYLE_JOIN) + need()
    words = [(_TYPOS.get(w, w) if rng.random() < 0.35 else w) for w in text.split(" ")]
    text = rng.choice(_FREESTYLE_OPEN) + " ".join(words) + rng.choice(_FREESTYLE_CLOSE)
    return text[:1].upper() + text[1:] if rng.random() < 0.25 else text


# ------------------------------------------------ repeat (answers repeat the input)

#: tasks whose answer repeats much of the input; the task verb starts the message and
#: the text follows a colon, so a router can match ``(?i)^\W*(rewrite|fix|...)``-like
#: patterns (see REPEAT_VERBS)
REPEAT_VERBS = ("rewrite", "rephrase", "fix", "correct", "copy", "reformat", "repeat")
_REPEAT_TASKS = [
    "Rewrite this more politely: {rude}",
    "Rephrase this in a friendlier tone: {rude}",
    "Fix the spelling and grammar: {sloppy}",
    "Correct the mistakes in this text: {sloppy}",
    "Copy this list as bullet points: {items}",
    "Reformat as a table with two columns, item and amount: {table}",
    "Repeat the following text exactly: {plain}",
]
_REPEAT_TEXTS = {
    "rude": ["Your new schedule is useless. Nobody checked it before sending it out. Send a fixed one today.",
             "I asked for the report twice already. Where is it? This delay is not acceptable.",
             "The meeting was a waste of time. Next time come prepared or cancel it.",
             "Stop sending me these reminders. I know the deadline. I will finish when I finish.",
             "The hotel room was dirty and the staff ignored us. We want our money back."],
    "sloppy": ["me and him goes to the libary every tuesday, but last week it were closed becuase of a storm.",
               "their going to announce the winers tomorow, so dont forget to bring you're ticket.",
               "the garden look beatiful in spring, expecially when the tulips is blooming allong the fence.",
               "i has finished the draft yesterday but i forgot to atach it to the email, sory about that.",
               "we was planing a trip to the mountains but the wheather forcast said it will rain all weak."],
    "items": ["milk, eggs, two loaves of bread, butter, a bag of apples, coffee beans",
              "passport, phone charger, sunscreen, hiking boots, rain jacket, first aid kit",
              "call the plumber, pay the electricity bill, water the plants, book the dentist, return library books",
              "flour, sugar, baking powder, vanilla extract, three eggs, a pinch of salt"],
    "table": ["rent 1200, groceries 350, transport 90, internet 45, gym 30",
              "apples 3, pears 5, bananas 12, oranges 7",
              "chairs 8, tables 2, lamps 4, shelves 3, rugs 1"],
    "plain": ["The library opens at nine on weekdays and at ten on Saturdays. It is closed on Sundays and holidays.",
              "Please leave the keys at the front desk when you check out. Breakfast is served until half past ten.",
              "The train to the coast leaves every hour from platform four. Tickets can be bought on board.",
              "Bring a warm jacket and sturdy shoes. The trail is steep near the top and the wind is cold."],
}


def _repeat(rng: random.Random, part: str) -> str:
    if part != "bench":
        raise ValueError("the repeat set is held-out only")
    task = rng.choice(_REPEAT_TASKS)
    slot = task[task.index("{") + 1:task.index("}")]
    return task.format(**{slot: rng.choice(_REPEAT_TEXTS[slot])})


GENERATORS = {"support": _support, "code": _code, "general": _general}
#: held-out sets with no tuning part: file stem -> (domain label, generator)
EXTRA_SETS = {"support-freestyle": ("support", _support_freestyle), "repeat-heldout": ("repeat", _repeat)}


def _unique(gen, rng: random.Random, part: str, n: int) -> list[str]:
    out: dict[str, None] = {}
    for _ in range(50 * n):
        out.setdefault(gen(rng, part))
        if len(out) == n:
            break
    return list(out)


def ngrams(ids: list[int], n: int = NGRAM) -> set[tuple[int, ...]]:
    return {tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)}


def build(tokenizer, seed: int = 0) -> dict[str, dict[str, list[str]]]:
    """{domain: {"tune": [...], "bench": [...]}} with the 8-gram property enforced."""
    out = {}
    for domain, gen in GENERATORS.items():
        rng = random.Random(f"{seed}-{domain}")
        tune = _unique(gen, rng, "tune", TUNE_PER_DOMAIN)
        seen: set[tuple[int, ...]] = set()
        for text in tune:
            seen |= ngrams(tokenizer.encode(text, add_special_tokens=False))
        bench = [t for t in _unique(gen, rng, "bench", 4 * BENCH_PER_DOMAIN)
                 if not ngrams(tokenizer.encode(t, add_special_tokens=False)) & seen][:BENCH_PER_DOMAIN]
        if len(bench) < BENCH_PER_DOMAIN:
            raise SystemExit(f"{domain}: only {len(bench)} held-out prompts without a shared {NGRAM}-gram")
        out[domain] = {"tune": tune, "bench": bench}
    return out


def build_extra(tokenizer, sets: dict[str, dict[str, list[str]]], seed: int = 0) -> dict[str, list[str]]:
    """{stem: prompts} of :data:`EXTRA_SETS`, none sharing an 8-gram with any tuning prompt."""
    seen: set[tuple[int, ...]] = set()
    for parts in sets.values():
        for text in parts["tune"]:
            seen |= ngrams(tokenizer.encode(text, add_special_tokens=False))
    out = {}
    for stem, (_, gen) in EXTRA_SETS.items():
        rng = random.Random(f"{seed}-{stem}")
        kept = [t for t in _unique(gen, rng, "bench", 2 * BENCH_PER_DOMAIN)
                if not ngrams(tokenizer.encode(t, add_special_tokens=False)) & seen][:BENCH_PER_DOMAIN]
        if len(kept) < BENCH_PER_DOMAIN:
            raise SystemExit(f"{stem}: only {len(kept)} prompts without a shared {NGRAM}-gram")
        out[stem] = kept
    return out


def add_more_tuning(tokenizer, sets: dict[str, dict[str, list[str]]], extra: dict[str, list[str]],
                    seed: int = 0) -> None:
    """Append :data:`EXTRA_TUNE` prompts per domain to its tuning prompts, each new and
    sharing no 8-token sequence with any held-out prompt (of any set); the held-out
    sets were drawn before and stay as they were."""
    held: set[tuple[int, ...]] = set()
    for text in [t for parts in sets.values() for t in parts["bench"]] + [t for ts in extra.values() for t in ts]:
        held |= ngrams(tokenizer.encode(text, add_special_tokens=False))
    gens = {"support": _support_more}
    for domain, count in EXTRA_TUNE.items():
        rng = random.Random(f"{seed}-{domain}-more")
        known = set(sets[domain]["tune"])
        more = [t for t in _unique(gens[domain], rng, "tune", 2 * count)
                if t not in known and not ngrams(tokenizer.encode(t, add_special_tokens=False)) & held][:count]
        if len(more) < count:
            raise SystemExit(f"{domain}: only {len(more)} more tuning prompts without a held-out {NGRAM}-gram")
        sets[domain]["tune"] += more


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, type=Path, help="the target model directory (its tokenizer)")
    parser.add_argument("--out", type=Path, default=HERE / "prompts")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    sets = build(tokenizer)
    extra = build_extra(tokenizer, sets)
    add_more_tuning(tokenizer, sets, extra)
    args.out.mkdir(parents=True, exist_ok=True)
    for domain, parts in sets.items():
        with open(args.out / f"{domain}-tune.jsonl", "w") as f:
            f.writelines(json.dumps({"domain": domain, "prompt": text}) + "\n" for text in parts["tune"])
        with open(args.out / f"{domain}-heldout.jsonl", "w") as f:
            f.writelines(json.dumps({"domain": domain, "prompt": text}) + "\n" for text in parts["bench"])
    for stem, texts in extra.items():
        with open(args.out / f"{stem}.jsonl", "w") as f:
            f.writelines(json.dumps({"domain": EXTRA_SETS[stem][0], "prompt": text}) + "\n" for text in texts)
    for domain, parts in sets.items():
        print(f"{domain}: {len(parts['tune'])} tuning, {len(parts['bench'])} held-out prompts")
    for stem, texts in extra.items():
        print(f"{stem}: {len(texts)} held-out prompts ({EXTRA_SETS[stem][0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
