"""Plot shapes: each one writes a whole story into a StoryWriter, beat by beat.

Every beat has several wordings so that stories sharing a plot still read differently. The cast
and the slots are set up by ``cast_story`` before a plot runs.
"""

from __future__ import annotations

from collections.abc import Callable

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


# -- the plot shapes ---------------------------------------------------------------------------


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


PLOTS: dict[str, Callable[[StoryWriter], None]] = {
    "lost_and_found": lost_and_found,
    "sharing": sharing,
    "fear_overcome": fear_overcome,
    "trip": trip,
    "misunderstanding": misunderstanding,
    "lesson_learned": lesson_learned,
    "new_friend": new_friend,
    "gift": gift,
    "rescue": rescue,
}


