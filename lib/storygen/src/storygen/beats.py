"""The cast of a story, and the beats several plot shapes share.

:func:`cast_story` chooses the characters, the place and the small details (weather, time of day,
a loved activity, a snack...) into the writer's slots before a plot runs; the beats here
(introducing the hero and a friend, setting the day, a closing line) are written from those
slots. Every beat has several wordings so that stories sharing a plot still read differently.
"""

from __future__ import annotations

from storygen import lexicon
from storygen.grammar import with_article
from storygen.writer import StoryWriter


def cast_story(w: StoryWriter) -> None:
    """Choose the cast, the place and the small details every plot can use."""
    hero = w.anyone()
    friend = w.anyone()
    place = w.place()
    spots = w.sample(place.spots, 3)
    w.slots.update(
        hero=hero,
        friend=friend,
        adult=w.grown_up(),
        place=place,
        spot1=spots[0],
        spot2=spots[1],
        spot3=spots[2],
        sight=w.pick(place.sights),
        weather=w.pick(lexicon.WEATHER),
        time=w.pick(lexicon.TIMES_OF_DAY),
        season=w.pick(lexicon.SEASONS),
        love=w.pick(lexicon.LOVES),
        activity=w.pick(lexicon.ACTIVITIES),
        activity2=w.pick(lexicon.ACTIVITIES),
        move=w.pick(lexicon.MOVES),
        food=w.pick(lexicon.FOODS),
        snack=w.pick(lexicon.SNACKS),
        thing=w.thing(),
        happy=w.pick(lexicon.HAPPY_FEELINGS),
        sad=w.pick(lexicon.SAD_FEELINGS),
        sound=w.pick(lexicon.SOUNDS),
        scared=w.pick(lexicon.SCARED_FEELINGS),
        angry=w.pick(lexicon.ANGRY_FEELINGS),
    )


# -- beats shared by several plots -------------------------------------------------------------


def introduce_hero(w: StoryWriter) -> None:
    w.one_of(
        "Once upon a time, there was {hero.a_trait_kind} named {hero}.",
        "Once upon a time, in a small town, there lived {hero.a_kind} named {hero}.",
        "There once was {hero.a_kind} called {hero}.",
        "{hero} was {hero.a_trait_kind} who lived near {place}.",
        "Once there was {hero.a_kind}. {hero.His} name was {hero}.",
    )
    if w.maybe(0.8):
        w.one_of(
            "{hero.He} loved to {love}.",
            "More than anything, {hero} loved to {love}.",
            "{hero.He} was very {hero.trait}, and {hero.he} loved to {love}.",
            "Every day, {hero} liked to {love}.",
        )
    describe(w, "hero")


def describe(w: StoryWriter, who: str) -> None:
    """An optional detail or two about a character: looks, clothes, home, animal habits."""
    character = w.slots[who]
    if character.is_child:
        looks, homes = lexicon.CHILD_LOOKS, lexicon.CHILD_HOMES
    elif character.eats:
        looks, homes = lexicon.ANIMAL_LOOKS, lexicon.ANIMAL_HOMES
    else:
        looks, homes = lexicon.TOY_LOOKS, lexicon.TOY_HOMES
    w.slots.update(
        looks=w.pick(looks), home=w.pick(homes), clothes=w.pick(lexicon.CLOTHES),
        footwear=w.pick(lexicon.FOOTWEAR), pattern=w.pick(lexicon.PATTERNS), color=w.pick(lexicon.COLORS),
        color2=w.pick(lexicon.COLORS), sky=w.pick(lexicon.SKY_LINES),
    )
    w.slots["clothes_a"] = with_article(f"{w.slots['color']} {w.slots['clothes']}")
    slot = "{" + who
    if w.maybe(0.45):
        w.one_of(
            slot + ".He} lived in {home}.",
            slot + "} lived with " + slot + ".his} family in {home}.",
        )
    if w.maybe(0.45):
        if character.eats:
            w.one_of(
                slot + ".His} favorite food was " + character.eats + ".",
                "When " + slot + ".he} was happy, " + slot + ".he} " + character.sound + " and " + character.moves
                + " in circles.",
                slot + ".He} had {looks}.",
            )
        elif character.is_child:
            w.one_of(
                slot + ".He} had {looks}.",
                slot + ".He} always wore {clothes_a} and {color2} {footwear}.",
                slot + ".His} favorite " + "{clothes} was {color} {pattern}.",
            )
        else:
            w.one_of(slot + ".He} had {looks}.", slot + ".He} was a little old, but " + slot + ".he} was loved very much.")
    if w.maybe(0.3):
        w.add("{sky}")


def introduce_friend(w: StoryWriter) -> None:
    w.one_of(
        "{hero.His} best friend was {friend.a_kind} named {friend}.",
        "{hero} had a friend named {friend}, who was {friend.a_trait_kind}.",
        "{friend} was {friend.a_kind}, and {friend.he} was {hero.possessive} best friend.",
        "{hero} often played with {friend}, {friend.a_trait_kind} who lived nearby.",
    )
    if w.maybe(0.5):
        describe(w, "friend")


def set_the_day(w: StoryWriter) -> None:
    w.one_of(
        "One {weather} {time}, {hero} went to {place}.",
        "One {weather} {season} {time}, {hero} and {friend} went to {place}.",
        "On a {weather} {time}, {hero} {move} to {place} to play.",
        "One day, {hero} decided to go to {place}.",
    )
    if w.maybe(0.6):
        w.one_of(
            "There {hero.he} saw {sight}.",
            "{hero.He} looked around and saw {sight}.",
            "It was fun to watch {sight}.",
        )


def closing(w: StoryWriter) -> None:
    w.add(w.pick(lexicon.CLOSING_LINES))
