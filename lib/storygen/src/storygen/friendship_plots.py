"""Plot shapes about two friends: sharing, a misunderstanding, making a new friend, a gift.

Each writes a whole story into a StoryWriter, beat by beat, from the slots
:func:`~storygen.beats.cast_story` filled.
"""

from __future__ import annotations

from storygen import lexicon
from storygen.beats import closing, introduce_friend, introduce_hero, set_the_day
from storygen.writer import StoryWriter


def sharing(w: StoryWriter) -> None:
    introduce_hero(w)
    introduce_friend(w)
    set_the_day(w)
    w.paragraph()
    if w.rng.random() < 0.5:
        w.one_of(
            "{hero} had a big basket of {snack}. {friend} had nothing to eat.",
            "{hero.possessive} mom had packed {snack} for {hero.his} lunch. {friend} had forgotten {friend.his} lunch at home.",
        )
        w.one_of("{friend.possessive} tummy made a loud rumble.", "{friend} looked at the {snack} and felt {sad}.")
        w.one_of(
            "At first, {hero} wanted to keep all the {snack} for {hero.himself}.",
            "{hero} did not want to share. {hero.He} wanted all the {snack}.",
        )
        w.say("hero", "These are mine.", "I want to eat them all!")
        w.one_of(
            "But then {hero} saw how {sad} {friend} was. {hero.He} remembered what {adult} always said: sharing is caring.",
            "Then {hero} thought about how {hero.he} would feel with an empty tummy.",
        )
        w.say(w.slots["hero"], "Here, {friend}. You can have half.", "Let's share. There is enough for both of us.")
        w.one_of(
            "{friend} smiled a big smile. They ate the {snack} together, and somehow the food tasted even better.",
            "They sat side by side and shared the {snack}. It was the best lunch ever.",
        )
    else:
        w.one_of(
            "{hero} and {friend} both wanted to play with {thing.a}.",
            "There was only one {thing.full}, and {hero} and {friend} both wanted it.",
        )
        w.say("friend", "It's my turn!", "I saw it first!")
        w.say("hero", "No, it's mine!", "Give it to me!")
        w.one_of(
            "They pulled and pulled, and both of them felt {angry}.",
            "They started to argue, and soon they were both very {angry}.",
        )
        w.one_of(
            "{adult} heard the noise and came over.",
            "Just then, {adult} walked by and saw them.",
        )
        w.say(w.slots["adult"], "Why don't you take turns? Playing together is more fun than fighting.",
              "If you share, you can both have fun.")
        w.one_of(
            "{hero} and {friend} looked at each other. They decided to try.",
            "The two friends stopped pulling and thought about it.",
        )
        w.one_of(
            "First {hero} played with {thing.the}, and then {friend} had a turn. Then they found a way to play with it together.",
            "They took turns, and soon they were laughing again.",
        )
    w.paragraph()
    w.one_of(
        "{hero} learned that sharing makes everyone happy.",
        "That day, {hero} learned that when you share, you get a friend to play with.",
        "Sharing made them both feel {happy}.",
    )
    if w.maybe(0.8):
        w.one_of("After that, they {activity} together.", "Then they {activity} until it was time to go home.")
    if w.maybe(0.4):
        closing(w)


def misunderstanding(w: StoryWriter) -> None:
    w.slots["cause"] = w.pick(lexicon.MISUNDERSTANDING_CAUSES)
    introduce_hero(w)
    introduce_friend(w)
    w.one_of(
        "{hero} had {thing.a}, and {hero.he} was very proud of it.",
        "One day, {adult} gave {hero} {thing.a}.",
    )
    w.one_of(
        "{friend} liked {thing.the} too and often asked to hold it.",
        "{friend} said that {thing.the} was the nicest thing {friend.he} had ever seen.",
    )
    w.paragraph()
    w.one_of(
        "The next morning, {thing.the} was gone!",
        "But one {weather} {time}, {hero} could not find {thing.the} anywhere.",
    )
    w.one_of(
        "{hero} thought that {friend} must have taken it.",
        "{hero} remembered how much {friend} liked it, and {hero.he} felt {angry}.",
    )
    w.say(w.slots["hero"], "You took my {thing.noun}! Give it back!", "I know you took it, {friend}!", verb="shouted")
    w.say("friend", "I didn't take it, I promise!", "But I didn't! I would never take your things.")
    w.one_of(
        "{friend} was very {sad} and walked away with tears in {friend.his} eyes.",
        "{friend.possessive} face fell. {friend.He} went home feeling {sad}.",
    )
    w.paragraph()
    w.one_of(
        "Later, {hero} went to {place} and looked {spot1}.",
        "That afternoon, {adult} helped {hero} look for {thing.the}.",
    )
    w.one_of(
        "There was {thing.the}! It turned out that {cause}.",
        "They found it {spot2}. It turned out that {cause}.",
    )
    w.one_of(
        "{hero} felt terrible. {friend} had not taken it after all.",
        "{hero.possessive} cheeks turned red. {hero.He} had blamed {hero.his} friend for nothing.",
    )
    w.paragraph()
    w.one_of("{hero} {move} to {friend.possessive} house.", "{hero} went to find {friend} right away.")
    w.say(w.slots["hero"], "I am sorry, {friend}. I was wrong to blame you.",
          "I'm so sorry. I should have asked you nicely instead of shouting.")
    w.one_of("{friend} smiled and said it was okay.", "{friend} gave {hero} a hug.")
    w.say("friend", "I forgive you. Friends make mistakes sometimes.", "It's okay. Let's play!")
    w.one_of(
        "{hero} learned that you should never blame someone before you know what really happened.",
        "After that, {hero} always asked first instead of getting {angry}.",
    )
    if w.maybe(0.7):
        w.one_of("Then the two friends {activity} together.", "They {activity}, and it was a happy day after all.")


def new_friend(w: StoryWriter) -> None:
    introduce_hero(w)
    w.one_of(
        "{hero} had just moved to a new home near {place}. {hero.He} did not know anyone.",
        "{hero} felt {sad} because {hero.he} had no one to play with.",
        "All the others were busy, and {hero} was lonely.",
    )
    set_the_day(w)
    w.paragraph()
    if w.rng.random() < 0.5:
        w.slots["quiet_sound"] = w.pick(lexicon.QUIET_SOUNDS)
        w.add("Then {hero} heard {quiet_sound} {spot1}.")
        w.one_of(
            "It was {friend.a_kind} named {friend}. {friend.He} looked {sad}.",
            "It was {friend}, {friend.a_trait_kind}. {friend.He} was shy and looked at the ground.",
        )
    else:
        w.add("Suddenly, {hero} saw {friend.a_kind} sitting all alone {spot1}. {friend.He} looked {sad}.")
    w.say("hero", "Hello! My name is {hero}. What is your name?", "Hi! Do you want to play with me?",
          "Are you okay? Why are you all alone?")
    w.say("friend", "I'm {friend}. Nobody wants to play with me.", "My name is {friend}. I am new here too.")
    w.one_of(
        "{hero} smiled. {hero.He} knew just how {friend} felt.",
        "{hero} sat down next to {friend}.",
    )
    w.say("hero", "I will play with you! We can be friends.", "Then let's be friends!")
    w.paragraph()
    w.one_of(
        "They {activity}. Then they {activity2}.",
        "First they {activity}, and after that they {activity2}.",
    )
    if w.maybe(0.6):
        w.one_of("{friend} laughed for the first time that day.", "Soon they were both laughing.")
    w.one_of(
        "When it was time to go home, they promised to meet again the next day.",
        "{hero} was not lonely anymore, and neither was {friend}.",
    )
    w.one_of(
        "{hero} learned that a kind word can make a new friend.",
        "Sometimes the best friends are the ones you meet by saying hello.",
        "From then on, {hero} and {friend} played together every day.",
    )
    if w.maybe(0.4):
        closing(w)


def gift(w: StoryWriter) -> None:
    w.slots.update(gift=w.pick(lexicon.GIFTS), occasion=w.pick(lexicon.OCCASIONS))
    introduce_hero(w)
    introduce_friend(w)
    w.one_of(
        "Soon it would be {friend.possessive} {occasion}.",
        "{friend.possessive} {occasion} was coming, and {hero} wanted to give {friend.him} something special.",
    )
    w.one_of(
        "{hero} decided to make {gift}.",
        "{hero} thought and thought. Then {hero.he} had an idea: {hero.he} would make {gift}!",
    )
    w.paragraph()
    w.one_of(
        "{hero.He} worked on it all {time}. It took a long time, but {hero.he} did not give up.",
        "{hero.He} worked very hard. {adult} helped a little.",
    )
    w.one_of(
        "But then, oh no! {hero} tripped, and the gift fell in a puddle.",
        "But a big gust of wind came and blew the gift away.",
        "But {hero.his} little brother knocked it over, and it broke.",
    )
    w.one_of("{hero} felt {sad}. Now {hero.he} had nothing to give.", "{hero} sat down and cried.")
    w.say(w.slots["adult"], "Don't give up. You can make something new. What matters is the love you put in it.",
          "It's okay. Let's think of something else together.")
    w.one_of(
        "So {hero} made a new gift, a little different from the first one.",
        "{hero} wiped {hero.his} tears and started again.",
    )
    w.paragraph()
    w.one_of(
        "On the big day, {hero} gave the gift to {friend}.",
        "When {friend.possessive} {occasion} came, {hero} gave {friend.him} the gift with a shy smile.",
    )
    w.say("friend", "Did you make this for me? I love it!", "This is the best gift ever! Thank you, {hero}!")
    w.one_of(
        "{hero} felt warm and {happy} inside.",
        "{hero} learned that the best gifts come from the heart.",
    )
    if w.maybe(0.7):
        w.one_of("Then they {activity} and ate {food}.", "After that, everyone {activity}.")
    if w.maybe(0.4):
        closing(w)
