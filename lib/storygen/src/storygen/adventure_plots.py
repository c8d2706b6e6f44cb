"""Plot shapes about the hero meeting trouble: a lost thing, a fear, a trip, a lesson, a rescue.

Each writes a whole story into a StoryWriter, beat by beat, from the slots
:func:`~storygen.beats.cast_story` filled.
"""

from __future__ import annotations

from storygen import lexicon
from storygen.beats import closing, introduce_hero, set_the_day
from storygen.writer import StoryWriter


def lost_and_found(w: StoryWriter) -> None:
    introduce_hero(w)
    w.one_of(
        "{hero.He} had {thing.a}. It was {hero.his} favorite thing in the whole world.",
        "{hero} had {thing.a} that {hero.he} took everywhere.",
        "{hero.possessive} favorite toy was {thing.a}. {hero.He} loved it very much.",
    )
    set_the_day(w)
    w.one_of(
        "{hero.He} played with {thing.the} for a long time. Then {hero.he} {activity2} with some new friends.",
        "{hero.He} put {thing.the} down {spot1} and ran off to play.",
        "{hero.He} was having so much fun that {hero.he} forgot all about {thing.the}.",
    )
    w.paragraph()
    w.one_of(
        "When it was time to go home, {hero} looked for {thing.the}, but it was gone!",
        "Later, {hero} reached for {thing.the}, but it was not there.",
        "Soon {hero} saw that {thing.the} was missing.",
    )
    w.one_of("{hero} felt very {sad}.", "{hero.He} was so {sad} that {hero.he} started to cry.",
             "{hero.His} eyes filled with tears.")
    w.say("hero", "Where is my {thing.noun}?", "Oh no! I lost my {thing.noun}!", "I can't find my {thing.noun} anywhere!")
    w.one_of(
        "Just then, {friend} came by.",
        "{friend} saw that {hero} was {sad} and came over.",
        "{friend} heard {hero} and {move} over to help.",
    )
    w.say(w.slots["friend"], "Don't worry, {hero}. I will help you look for it.",
          "Let's look for it together!", "We will find it. Two friends are better than one.")
    w.paragraph()
    w.one_of("First they looked {spot2}, but it was not there.", "They searched {spot2}. There was nothing there but dust.")
    if w.maybe(0.7):
        w.one_of("Then they looked {spot1}. It was not there either.", "Next, they checked {spot1}, but they only found a lost sock.")
    finder = w.pick(("hero", "friend"))
    w.slots["finder"] = w.slots[finder]
    w.one_of(
        "At last, {finder} looked {spot3}, and there it was!",
        "Then {finder} saw something poking out {spot3}. It was {thing.the}!",
        "Finally, {finder} found {thing.the} {spot3}.",
    )
    w.say(w.slots["hero"], "You found it! Thank you, {friend}!", "My {thing.noun}! Thank you so much!", verb="shouted")
    w.one_of(
        "{hero} hugged {thing.the} and then hugged {friend}.",
        "{hero} was so {happy}. {hero.He} gave {friend} a big hug.",
    )
    w.paragraph()
    w.one_of(
        "From that day on, {hero} always kept {thing.the} close, and {hero.he} never forgot how {friend} helped {hero.him}.",
        "{hero} learned to be careful with {hero.his} things, and that a good friend always helps.",
        "After that, {hero} and {friend} {activity} until the sun went down.",
    )
    if w.maybe(0.5):
        closing(w)


def fear_overcome(w: StoryWriter) -> None:
    fear, fear_word = w.pick(lexicon.FEARS)
    w.slots.update(fear=fear, fear_word=fear_word)
    introduce_hero(w)
    w.one_of(
        "But {hero} had a secret. {hero.He} was afraid of {fear}.",
        "{hero} was brave about most things, but {hero.he} was very afraid of {fear}.",
        "There was one thing {hero} did not like at all: {fear}.",
    )
    w.one_of(
        "Whenever {hero.he} thought about it, {hero.his} tummy felt funny.",
        "Just thinking about it made {hero.him} feel {scared}.",
        "{hero.He} would hide behind {adult} every time.",
    )
    w.paragraph()
    set_the_day(w)
    w.one_of(
        "{friend} wanted {hero} to try, but {hero} shook {hero.his} head.",
        "That day, {hero} had to face {fear}.",
        "{friend} was there too, and {friend.he} saw that {hero} looked {scared}.",
    )
    w.say("hero", "I can't do it. I am too scared.", "What if something bad happens?", "I don't want to!")
    w.one_of(
        "{friend} held {hero.possessive} hand.",
        "{adult} knelt down next to {hero}.",
        "{friend} sat down next to {hero.him}.",
    )
    helper = w.pick(("friend", "adult"))
    w.slots["helper"] = w.slots[helper]
    w.say(w.slots["helper"], "It is okay to be scared. Being brave means trying even when you are scared.",
          "I will be right here with you. Let's try together, one little step at a time.",
          "You are braver than you think, {hero}.")
    w.paragraph()
    w.one_of(
        "{hero} took a deep breath. {hero.He} counted to three.",
        "{hero} closed {hero.his} eyes, took a big breath, and nodded.",
        "{hero} thought about it for a long time. Then {hero.he} stood up tall.",
    )
    w.one_of(
        "Slowly, {hero} tried. It was not as {fear_word} as {hero.he} thought!",
        "{hero.He} did it! It was scary for a moment, and then it was fun.",
        "Step by step, {hero} faced {fear}, and nothing bad happened at all.",
    )
    w.say("hero", "I did it! I was brave!", "That was not so bad after all!", verb="shouted")
    w.one_of(
        "{helper} clapped and cheered.",
        "{helper} gave {hero} a big hug.",
        "{helper} smiled a proud smile.",
    )
    w.paragraph()
    w.one_of(
        "{hero} felt {happy} and proud. {hero.He} was not afraid of {fear} anymore.",
        "From then on, {hero} knew that being brave does not mean you are never scared.",
        "That night, {hero} told everyone how {hero.he} had been brave.",
    )
    if w.maybe(0.5):
        closing(w)


def trip(w: StoryWriter) -> None:
    destination, travel, sights, doings = w.pick(lexicon.TRIPS)
    problem, fix = w.pick(lexicon.TRIP_PROBLEMS)
    w.slots.update(destination=destination, travel=travel, doings=doings, problem=problem, fix=fix,
                   tripsight1=sights[0], tripsight2=sights[1], tripsight3=sights[2])
    introduce_hero(w)
    w.one_of(
        "One {weather} {time}, {adult} said they were going on a trip to {destination}.",
        "One day, {hero.possessive} family went on a trip to {destination}.",
        "{hero} had waited all {season} for the big trip to {destination}.",
    )
    w.say("hero", "Hooray! Can {friend} come too?", "I can't wait!", "Are we there yet?")
    w.one_of(
        "{friend} came along, and they went {travel}.",
        "So {hero}, {friend} and {adult} went {travel}.",
        "{hero} and {friend} packed a bag with {snack}, and everyone went {travel}.",
    )
    if w.maybe(0.7):
        w.one_of(
            "On the way, {hero} looked out and counted trees, cows and clouds.",
            "The trip was long, so they sang songs on the way.",
            "{friend} fell asleep on the way, but {hero} was too excited to sleep.",
        )
    w.paragraph()
    w.one_of(
        "But on the way, {problem}.",
        "Then something went wrong: {problem}.",
        "Halfway there, {problem}.",
    )
    w.one_of("{hero} felt {sad}.", "{friend} was worried that they would never get there.", "Everyone was {sad} for a moment.")
    w.one_of("Then {fix}.", "Luckily, {fix}.", "But soon {fix}.")
    w.paragraph()
    w.one_of(
        "At last they got to {destination}. They saw {tripsight1} and {tripsight2}.",
        "When they arrived, {hero.possessive} eyes grew wide. There were {tripsight1}, {tripsight2} and {tripsight3}!",
        "{destination} was even better than {hero} had dreamed. {hero.He} saw {tripsight3}.",
    )
    w.say("friend", "Look at that! It's amazing!", "Wow! I have never seen anything like this!", verb="shouted")
    w.one_of("They {doings}.", "All day long they {doings}.")
    if w.maybe(0.6):
        w.one_of("They had {food} for lunch.", "{adult} bought them {food} as a treat.")
    w.paragraph()
    w.one_of(
        "When the sun went down, they went home, tired and {happy}.",
        "On the way home, {hero} fell asleep, dreaming of {destination}.",
        "That night, {hero} drew a picture of {tripsight2} so {hero.he} would never forget the trip.",
    )
    if w.maybe(0.5):
        closing(w)


def lesson_learned(w: StoryWriter) -> None:
    plan, result, lesson = w.pick(lexicon.LESSON_MISTAKES)
    w.slots.update(plan=plan, result=result, lesson=lesson)
    introduce_hero(w)
    set_the_day(w)
    w.paragraph()
    w.one_of(
        "{hero} wanted to {plan}.",
        "{hero} had an idea. {hero.He} would {plan}!",
        "That day, {hero} really wanted to {plan}.",
    )
    w.one_of(
        "{adult} said, \"Please don't, {hero}. It is not a good idea.\"",
        "{friend} said, \"I don't think you should do that.\"",
        "{adult} shook {adult.his} head and said no.",
    )
    w.one_of(
        "But {hero} did not listen.",
        "{hero} did not want to listen. {hero.He} thought {hero.he} knew best.",
        "{hero} just laughed and did it anyway.",
    )
    w.paragraph()
    w.one_of(
        "Oh no! {hero} {result}.",
        "Soon {hero} {result}.",
        "It did not go well. {hero} {result}.",
    )
    w.one_of("{hero.He} felt {sad} and started to cry.", "{hero.He} was {sad} and a little {scared}.")
    w.say("hero", "I should have listened.", "I'm sorry. I wish I had listened to you.")
    w.one_of(
        "{adult} gave {hero.him} a hug and helped {hero.him} feel better.",
        "{adult} came and helped. {adult.He} was not angry.",
        "{friend} helped {hero} and told {hero.him} everything would be okay.",
    )
    w.say(w.slots["adult"], "Everybody makes mistakes. What matters is that we learn from them.",
          "It's okay. Now you know why I said no.")
    w.paragraph()
    w.one_of(
        "{hero} learned an important lesson that day: {lesson}.",
        "That day, {hero} learned that {lesson}.",
    )
    if w.maybe(0.7):
        w.one_of("The next day, {hero} and {friend} {activity}, and this time {hero} was careful.",
                 "After that, {hero} always listened, and {hero.he} was much more careful.")


def rescue(w: StoryWriter) -> None:
    creature, trouble, fix = w.pick(lexicon.RESCUES)
    w.slots.update(creature=creature, trouble=trouble, fix=fix)
    introduce_hero(w)
    set_the_day(w)
    w.paragraph()
    w.one_of(
        "Suddenly, {hero} heard {sound}.",
        "As {hero} {move} along, {hero.he} heard {sound} coming from {spot1}.",
    )
    w.one_of(
        "{hero.He} looked and saw {creature}. It {trouble}.",
        "There was {creature}, and it {trouble}.",
    )
    w.say("hero", "Oh no! We have to help!", "Poor little thing! Don't worry, I will help you.")
    w.one_of(
        "{hero} tried, but {hero.he} could not do it alone.",
        "{hero.He} was too small to help all by {hero.himself}.",
    )
    w.one_of(
        "{hero} ran to get {friend}.",
        "Just then, {friend} came by.",
        "{hero} called for {friend}, who came running.",
    )
    w.paragraph()
    w.one_of(
        "Together, they {fix}.",
        "{hero} and {friend} worked as a team. They {fix}.",
    )
    w.one_of(
        "The little creature looked up at them as if to say thank you.",
        "The animal was safe! It looked very {happy}.",
    )
    w.say("friend", "We did it! We make a great team!", "Hooray! We helped!", verb="shouted")
    w.paragraph()
    w.one_of(
        "{hero} and {friend} felt proud. Helping others made them feel {happy}.",
        "That day, {hero} learned that when we help each other, we can do big things.",
        "When they told {adult}, {adult.he} said they were very kind and brave.",
    )
    if w.maybe(0.6):
        w.one_of("Then they {activity} until dinner time.", "After that, they shared some {food}.")
    if w.maybe(0.4):
        closing(w)
