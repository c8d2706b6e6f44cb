"""The words the story generator draws from.

Plain data, grouped by the role a word plays in a sentence, so that templates can ask for "a place"
or "a feeling" and always get something that fits grammatically. Lists are long on purpose: the
corpus must have a vocabulary of a few thousand words for a small model to learn something
beyond a handful of phrases. Everything here is simple vocabulary a young child would know.
"""

GIRL_NAMES = (
    "Lily", "Mia", "Emma", "Sara", "Lucy", "Anna", "Zoe", "Ella", "Ruby", "Molly", "Amy", "Lola",
    "Daisy", "Rosie", "Ava", "Chloe", "Grace", "Hannah", "Ivy", "Jane", "Kate", "Maya", "Nora",
    "Olive", "Pia", "Rose", "Sophie", "Tina", "Una", "Vera", "Wendy", "Yara", "Alice", "Bella",
    "Clara", "Dora", "Eva", "Fiona", "Gemma", "Hazel", "Iris", "Julia", "Kira", "Leah", "Maria",
    "Nina", "Poppy", "Rita", "Sally", "Tara", "Abby", "Becky", "Cora", "Dina", "Elsie", "Flora",
    "Greta", "Heidi", "Ingrid", "Jenny", "Lena", "Millie", "Nell", "Penny", "Rosa", "Stella",
    "Tess", "Violet", "Willa", "Amara", "Layla", "Sofia", "Aria", "Luna", "Hope", "Joy", "June",
    "Beth", "Carla", "Edith", "Faith", "Gina", "Holly", "Isla", "Jade", "Kim", "Lara", "Mabel",
    "Nadia", "Opal", "Pearl", "Quinn", "Roxy", "Sienna", "Thea", "Uma", "Wren", "Xena", "Yasmin",
    "Zara", "Ada", "Bonnie", "Celia", "Dolly", "Esme", "Fern", "Gwen", "Hattie", "Ines", "Josie",
)

BOY_NAMES = (
    "Tom", "Ben", "Max", "Sam", "Leo", "Jack", "Tim", "Finn", "Jake", "Noah", "Liam", "Owen",
    "Luke", "Adam", "Eli", "Hugo", "Ivan", "Joe", "Kai", "Milo", "Ned", "Oscar", "Paul", "Ray",
    "Sid", "Theo", "Victor", "Will", "Zack", "Alex", "Billy", "Carl", "Dan", "Eddie", "Felix",
    "George", "Harry", "Jimmy", "Kevin", "Louis", "Mark", "Nick", "Oliver", "Peter", "Ricky",
    "Simon", "Toby", "Vince", "Walter", "Arlo", "Bobby", "Caleb", "Danny", "Ethan", "Freddy",
    "Gus", "Henry", "Isaac", "Jonah", "Kyle", "Lenny", "Mason", "Nate", "Otto", "Pete", "Rex",
    "Ronnie", "Rudy", "Ted", "Omar", "Ali", "Ravi", "Kenji", "Mateo", "Luis", "Amir", "Jonas",
    "Archie", "Bruno", "Colin", "Dexter", "Elliot", "Frank", "Gabe", "Hank", "Ian", "Jasper", "Karl",
    "Lewis", "Miles", "Neil", "Ollie", "Percy", "Quentin", "Reggie", "Stan", "Tyler", "Umar", "Wes",
    "Xavier", "Yusuf", "Zeke", "Albert", "Barney", "Cody", "Dewey", "Emil", "Flynn", "Hamish", "Jude",
)

# Names for animals and toys: short, playful, and distinct from the children's names.
PET_NAMES = (
    "Spot", "Fluffy", "Buddy", "Coco", "Pip", "Bubbles", "Whiskers", "Sunny", "Patch", "Biscuit",
    "Pepper", "Ziggy", "Muffin", "Button", "Snowy", "Tiny", "Rusty", "Shadow", "Peanut", "Bingo",
    "Cookie", "Dotty", "Fuzzy", "Gizmo", "Honey", "Jelly", "Kiki", "Lucky", "Mango", "Noodle",
    "Pebble", "Puff", "Rocky", "Sparky", "Tango", "Twinkle", "Waddles", "Wiggles", "Bouncy",
    "Chip", "Dash", "Flash", "Goldie", "Hoppy", "Jingles", "Marbles", "Nibbles", "Pudding",
    "Scout", "Squeak", "Taffy", "Toffee", "Zippy", "Blue", "Cinnamon", "Maple", "Clover", "Acorn",
    "Bumble", "Crumbs", "Doodle", "Fig", "Jumbo", "Pickles", "Sprout", "Wobble", "Beep", "Bolt",
)

# (species, how it moves, the sound it makes, what it likes to eat)
ANIMALS = (
    ("dog", "ran", "barked", "bones"), ("puppy", "ran", "yipped", "treats"),
    ("cat", "crept", "meowed", "fish"), ("kitten", "pounced", "mewed", "milk"),
    ("bunny", "hopped", "squeaked", "carrots"), ("rabbit", "hopped", "thumped", "clover"),
    ("bird", "flew", "chirped", "seeds"), ("duck", "waddled", "quacked", "bread crumbs"),
    ("frog", "hopped", "croaked", "flies"), ("bear", "lumbered", "growled", "honey"),
    ("fox", "trotted", "yipped", "berries"), ("mouse", "scurried", "squeaked", "cheese"),
    ("owl", "flew", "hooted", "mice"), ("squirrel", "scampered", "chattered", "nuts"),
    ("turtle", "crawled", "sighed", "lettuce"), ("pig", "trotted", "oinked", "apples"),
    ("cow", "walked", "mooed", "grass"), ("horse", "galloped", "neighed", "oats"),
    ("sheep", "trotted", "baaed", "grass"), ("goat", "jumped", "bleated", "leaves"),
    ("lion", "prowled", "roared", "meat"), ("tiger", "prowled", "roared", "meat"),
    ("elephant", "stomped", "trumpeted", "peanuts"), ("monkey", "swung", "chattered", "bananas"),
    ("giraffe", "strolled", "hummed", "leaves"), ("zebra", "galloped", "brayed", "grass"),
    ("penguin", "waddled", "squawked", "fish"), ("dolphin", "swam", "clicked", "fish"),
    ("fish", "swam", "blew bubbles", "worms"), ("whale", "swam", "sang", "tiny shrimp"),
    ("hen", "strutted", "clucked", "corn"), ("chick", "hopped", "peeped", "seeds"),
    ("deer", "leaped", "snorted", "leaves"), ("hedgehog", "shuffled", "sniffed", "bugs"),
    ("ladybug", "crawled", "buzzed", "tiny bugs"), ("butterfly", "fluttered", "hummed", "nectar"),
    ("bee", "buzzed", "hummed", "nectar"), ("snail", "slid", "sighed", "leaves"),
    ("crab", "scuttled", "clicked", "seaweed"), ("dragon", "flew", "puffed", "peppers"),
    ("dinosaur", "stomped", "roared", "leaves"), ("unicorn", "pranced", "neighed", "flowers"),
    ("koala", "climbed", "yawned", "leaves"), ("panda", "rolled", "munched", "bamboo"),
    ("kangaroo", "bounced", "grunted", "grass"), ("parrot", "flew", "squawked", "seeds"),
    ("raccoon", "scurried", "chittered", "berries"), ("beaver", "paddled", "slapped its tail", "sticks"),
    ("otter", "swam", "squeaked", "clams"), ("seal", "flopped", "barked", "fish"),
    ("camel", "plodded", "grunted", "dates"), ("llama", "trotted", "hummed", "hay"),
    ("donkey", "trotted", "brayed", "carrots"), ("swan", "glided", "honked", "water weeds"),
    ("goose", "waddled", "honked", "corn"), ("robin", "hopped", "sang", "worms"),
    ("bat", "swooped", "squeaked", "bugs"), ("lamb", "skipped", "bleated", "grass"),
    ("pony", "trotted", "whinnied", "apples"), ("hamster", "scurried", "squeaked", "seeds"),
)

# (kind, material or look) for toy characters.
TOYS = (
    ("teddy bear", "soft"), ("toy robot", "shiny"), ("rag doll", "floppy"), ("toy train", "red"),
    ("toy car", "fast"), ("wooden horse", "painted"), ("stuffed bunny", "fluffy"),
    ("toy soldier", "tin"), ("puppet", "silly"), ("toy truck", "yellow"), ("kite", "bright"),
    ("toy boat", "little"), ("spinning top", "striped"), ("toy plane", "silver"),
    ("stuffed lion", "cuddly"), ("toy dinosaur", "green"), ("music box", "tiny"),
    ("jack-in-the-box", "bouncy"), ("toy rocket", "shiny"), ("paper dragon", "colorful"),
)

GIRL_KINDS = ("girl", "little girl", "young girl")
BOY_KINDS = ("boy", "little boy", "young boy")

# Adults who can appear as helpers; each has a subject pronoun set through its gender.
ADULTS = (
    ("Mom", "female"), ("Dad", "male"), ("Grandma", "female"), ("Grandpa", "male"),
    ("Aunt May", "female"), ("Uncle Joe", "male"), ("Miss Green", "female"), ("Mr. Brown", "male"),
    ("the old owl", "male"), ("the wise turtle", "female"), ("the farmer", "male"),
    ("the kind baker", "female"), ("the park keeper", "male"), ("the teacher", "female"),
    ("Nana", "female"), ("Papa", "male"),
)

TRAITS = (
    "kind", "brave", "shy", "curious", "happy", "silly", "gentle", "clever", "friendly", "playful",
    "cheerful", "careful", "busy", "sleepy", "funny", "quiet", "loud", "bouncy", "helpful", "proud",
    "smart", "sweet", "bold", "lively", "polite", "patient", "honest", "jolly", "cheeky", "calm",
    "thoughtful", "caring", "eager", "grumpy", "little", "tiny", "fast", "strong", "messy", "neat",
    "dreamy", "chatty", "giggly", "daring", "gentle", "sporty", "bright", "fearless", "fussy", "generous",
)

COLORS = (
    "red", "blue", "green", "yellow", "pink", "purple", "orange", "white", "black", "brown",
    "gold", "silver", "gray", "golden", "bright red", "light blue", "dark green", "sky blue",
    "lemon yellow", "cherry red", "lime green", "navy blue", "rusty brown", "snow white", "rainbow",
)

OBJECT_ADJECTIVES = (
    "shiny", "little", "big", "soft", "round", "old", "new", "sparkly", "smooth", "fuzzy",
    "striped", "spotted", "tiny", "special", "favorite", "pretty", "bumpy", "squishy", "heavy",
    "light", "bright", "funny", "fancy", "wooden", "plastic", "paper", "glass", "woolly", "magic",
    "dusty", "polished", "shimmering", "wobbly", "crinkly", "twinkly", "velvet", "knitted", "painted",
    "lumpy", "fluffy", "gleaming", "patchy", "dented", "brand-new", "precious", "lucky", "enormous",
)

# Things a character can own, lose, find, share or be given.
OBJECTS = (
    "ball", "kite", "hat", "scarf", "doll", "teddy", "book", "crayon", "marble", "shell", "stone",
    "feather", "ribbon", "bell", "whistle", "balloon", "drum", "flute", "toy car", "toy boat",
    "blanket", "pillow", "cup", "spoon", "bucket", "shovel", "basket", "box", "key", "coin",
    "ring", "necklace", "bracelet", "button", "sock", "mitten", "glove", "boot", "shoe", "umbrella",
    "backpack", "lunchbox", "bottle", "jar", "lantern", "flashlight", "map", "compass", "clock",
    "watch", "mirror", "comb", "brush", "paintbrush", "pencil", "notebook", "sticker", "puzzle",
    "block", "robot", "train", "truck", "plane", "rocket", "wagon", "bike", "scooter", "skateboard",
    "jump rope", "yo-yo", "top", "puppet", "mask", "crown", "wand", "cape", "star", "flag", "leaf",
    "acorn", "pinecone", "flower", "rose", "daisy", "sunflower", "egg", "nest", "bone", "stick",
    "rock", "pebble", "piece of sea glass", "drawing", "picture", "card", "letter", "song book", "harmonica",
    "guitar", "piano toy", "xylophone", "tambourine", "bead", "button box", "toy crown", "pinwheel",
    "snow globe", "music box", "teacup", "tea set", "toy house", "dollhouse", "sandcastle mold",
    "fishing net", "bug jar", "magnifying glass", "telescope", "sled", "swing", "hula hoop",
    "ice cream cone", "cupcake", "cookie", "apple", "banana", "orange", "pear", "plum", "peach",
    "lollipop", "pinata", "piggy bank", "toy drum", "paper crown", "rubber duck", "beach ball",
    "soccer ball", "baseball bat", "teddy bear", "sleeping bag", "tent", "toy shovel", "watering can",
    "flower pot", "seed packet", "bird house", "bird feeder", "sketchbook", "storybook",
    "comic book", "photo", "ticket", "medal", "trophy", "badge", "hairclip", "headband",
    "wristwatch", "walkie-talkie", "toy phone", "calculator", "paint box", "glitter jar", "clay pot",
    "wooden spoon", "rolling pin", "cookie cutter", "lunch bag", "water bottle", "thermos", "candle",
    "snail shell", "starfish", "sand dollar", "fossil", "crystal", "gem", "marble bag", "treasure box",
    "pirate hat", "toy sword", "shield", "horn", "trumpet", "violin", "recorder", "bugle",
)

FOODS = (
    "apples", "bananas", "cookies", "cupcakes", "sandwiches", "grapes", "strawberries", "cherries",
    "carrots", "muffins", "pancakes", "crackers", "cheese", "bread", "pie", "cake", "soup",
    "popcorn", "oranges", "pears", "plums", "peaches", "blueberries", "raspberries", "watermelon",
    "lemonade", "juice", "milk", "honey toast", "rice", "noodles", "pizza", "corn", "peas",
    "jam tarts", "biscuits", "donuts", "pretzels", "ice cream", "yogurt", "melon", "mangoes",
    "nuts", "raisins", "waffles", "porridge", "tomatoes", "cucumbers", "berries", "candy",
    "muffins with jam", "cheese sandwiches", "fish sticks", "baked potatoes", "carrot sticks",
    "cinnamon buns", "apple pie", "banana bread", "fruit salad", "hot cocoa", "warm soup", "dumplings",
    "tacos", "scrambled eggs", "toast with butter", "oatmeal cookies", "lemon cake", "chocolate pudding",
    "peanut butter crackers", "pumpkin pie", "rice balls", "sweet potatoes", "plum jam", "cherry tarts",
)

# (place, spots inside it, things one can see there)
PLACES = (
    ("the park", ("under the slide", "by the pond", "behind the big oak tree", "near the swings", "under a bench"),
     ("ducks swimming in the pond", "children flying kites", "a man selling balloons", "squirrels racing up the trees")),
    ("the beach", ("behind a big rock", "near the waves", "under the sand", "by the tide pools", "next to a sandcastle"),
     ("seagulls flying over the water", "crabs running sideways", "boats far out on the sea", "shells shining in the sun")),
    ("the forest", ("under a pile of leaves", "inside a hollow log", "behind a mossy stone", "near the little stream", "under a tall pine"),
     ("birds singing in the branches", "mushrooms growing by the path", "sunlight coming through the leaves", "a deer drinking from the stream")),
    ("the garden", ("under the rose bush", "behind the flower pots", "in the vegetable patch", "by the garden gate", "near the bird bath"),
     ("bees buzzing around the flowers", "tomatoes turning red", "butterflies landing on the daisies", "worms wiggling in the soil")),
    ("the farm", ("in the barn", "behind the hay bales", "near the chicken coop", "by the old tractor", "in the pig pen"),
     ("cows eating grass", "hens pecking at corn", "a horse running in the field", "piglets rolling in the mud")),
    ("the school", ("under a desk", "in the coat room", "behind the bookshelf", "by the big window", "in the toy corner"),
     ("children painting pictures", "a map of the world on the wall", "a fish tank with orange fish", "a class garden by the door")),
    ("the library", ("between two books", "under a reading chair", "behind the big desk", "on a high shelf", "by the window seat"),
     ("rows and rows of books", "a cozy reading corner", "children listening to a story", "a sleepy cat on a cushion")),
    ("the kitchen", ("under the table", "behind the bread box", "in a drawer", "next to the oven", "on top of the fridge"),
     ("a pot of soup bubbling", "cookies cooling on a tray", "a bowl of shiny apples", "flour on the counter")),
    ("the backyard", ("under the porch", "behind the shed", "in the sandbox", "by the fence", "under the big tree"),
     ("a swing moving in the wind", "a bird feeder full of seeds", "the dog's red ball", "clothes drying on a line")),
    ("the meadow", ("in the tall grass", "behind a bush", "near a pile of stones", "by a small pond", "under a wild apple tree"),
     ("flowers of every color", "rabbits hopping about", "clouds drifting by", "grasshoppers jumping high")),
    ("the lake", ("by the wooden dock", "under the reeds", "behind a canoe", "near the shore", "on a flat rock"),
     ("fish jumping out of the water", "swans gliding by", "frogs sitting on lily pads", "a little boat with a white sail")),
    ("the playground", ("at the bottom of the slide", "under the climbing frame", "by the sandbox", "behind the seesaw", "near the merry-go-round"),
     ("children laughing on the swings", "a tall red slide", "a bright yellow seesaw", "a rope bridge")),
    ("the zoo", ("near the lion's cage", "by the monkey house", "behind the ice cream stand", "next to the penguin pool", "under a bench"),
     ("monkeys swinging on ropes", "a giraffe eating leaves", "penguins diving into the water", "an elephant spraying water")),
    ("the market", ("under a fruit stand", "behind a flower cart", "by the fish seller", "near the bread stall", "next to a big basket"),
     ("piles of red apples", "buckets of bright flowers", "loaves of warm bread", "people laughing and talking")),
    ("the hill", ("behind a big stone", "under a lonely tree", "in a patch of clover", "near the old fence", "at the very top"),
     ("the whole town far below", "kites dancing in the wind", "sheep eating grass", "a train going by in the valley")),
    ("the river", ("under the old bridge", "by the stepping stones", "behind the willow tree", "near the muddy bank", "on a sandy spot"),
     ("ducks paddling along", "leaves floating on the water", "a heron standing very still", "little fish in the shallow water")),
    ("the bakery", ("behind the counter", "under a shelf of bread", "near the big oven", "by the window", "in a flour sack"),
     ("warm bread on the shelves", "cakes with pink frosting", "a baker with a tall white hat", "cookies shaped like stars")),
    ("the attic", ("inside an old trunk", "under a dusty blanket", "behind a pile of boxes", "by the round window", "in a hat box"),
     ("old photos in frames", "a rocking horse", "boxes of old toys", "a spider web in the corner")),
    ("the snowy hill", ("under a pile of snow", "behind a snowman", "near the sled track", "by a frozen bush", "next to a pine tree"),
     ("children sliding on sleds", "a snowman with a carrot nose", "snowflakes falling softly", "footprints in the snow")),
    ("the town square", ("by the fountain", "under a bench", "near the clock tower", "behind the flower bed", "next to a lamp post"),
     ("pigeons pecking at crumbs", "a man playing the violin", "water splashing in the fountain", "children chasing bubbles")),
    ("the pond", ("under a lily pad", "behind the tall reeds", "on a muddy bank", "near a big log", "by a smooth stone"),
     ("frogs jumping from leaf to leaf", "dragonflies darting about", "ducklings following their mother", "turtles sunning on a log")),
    ("the orchard", ("under an apple tree", "in a basket of pears", "behind a ladder", "by the wooden gate", "in the long grass"),
     ("trees full of ripe fruit", "birds eating cherries", "bees flying from tree to tree", "baskets of shiny apples")),
    ("the cave", ("behind a pointy rock", "in a dark corner", "near a little pool", "under a low ledge", "by the opening"),
     ("drops of water falling from the roof", "rocks that sparkled", "a bat sleeping upside down", "strange shadows on the walls")),
    ("the island", ("under a palm tree", "behind a big shell", "in the warm sand", "near a tide pool", "by an old boat"),
     ("coconuts on the trees", "turtles crawling to the sea", "colorful fish in the water", "a lighthouse far away")),
    ("the toy shop", ("under a shelf", "behind a box of blocks", "inside a toy chest", "near the door", "by the window"),
     ("trains running on tracks", "dolls in pretty dresses", "balls of every size", "a giant teddy bear")),
)

# (adjective, noun, the part of the day) pieces for openings like "One sunny morning".
WEATHER = (
    "sunny", "rainy", "windy", "snowy", "cloudy", "warm", "cold", "bright", "foggy", "quiet",
    "lovely", "stormy", "chilly", "hot", "breezy", "cool", "beautiful", "gray",
)
TIMES_OF_DAY = ("morning", "afternoon", "day", "evening")
SEASONS = ("spring", "summer", "fall", "winter")

# Feelings as adjectives that fit "felt ..." and "was very ...".
HAPPY_FEELINGS = ("happy", "glad", "proud", "excited", "cheerful", "joyful", "thankful", "calm", "safe", "warm inside")
SAD_FEELINGS = ("sad", "upset", "worried", "hurt", "gloomy", "unhappy", "grumpy", "disappointed", "lonely")
SCARED_FEELINGS = ("scared", "afraid", "nervous", "frightened", "shaky", "uneasy")
ANGRY_FEELINGS = ("angry", "cross", "mad", "annoyed", "upset", "huffy")

# Past-tense activities two characters can do together.
ACTIVITIES = (
    "played tag", "played hide and seek", "built a tower of blocks", "drew pictures with chalk",
    "ran races", "jumped in puddles", "made a sandcastle", "flew a kite", "sang songs",
    "danced in circles", "picked flowers", "looked for bugs", "rolled down the hill",
    "played ball", "blew bubbles", "had a tea party", "made mud pies", "splashed in the water",
    "counted the clouds", "read a book together", "played on the swings", "made paper boats",
    "built a fort with pillows", "played catch", "collected shiny stones", "made a snowman",
    "raced their toy cars", "baked cookies", "painted rocks", "played a game of pretend",
    "told silly jokes", "had a picnic", "went down the slide", "fed the ducks",
    "chased butterflies", "looked at the stars", "made crowns out of leaves", "played music",
    "hopped like frogs", "watched the boats", "built a house for the ants", "climbed the little hill",
    "played hopscotch", "made a puppet show", "planted sunflower seeds", "raked the leaves into a big pile",
    "jumped into the pile of leaves", "made necklaces of daisies", "played leapfrog", "skipped stones on the pond",
    "pretended to be pirates", "had a pillow fight", "played dress-up", "made a band with pots and spoons",
    "drew a map of a secret island", "had a snowball fight", "went on a treasure hunt", "played marbles",
)

MOVES = ("ran", "skipped", "hurried", "raced", "walked", "wandered", "dashed", "marched", "hopped", "strolled")

# Things to be afraid of, as noun phrases that fit "was afraid of ...".
FEARS = (
    ("the dark", "dark"), ("thunder", "loud"), ("the big slide", "tall"), ("deep water", "deep"),
    ("the big dog next door", "big"), ("climbing trees", "high"), ("the noisy vacuum", "loud"),
    ("bees", "buzzy"), ("the tall ladder", "tall"), ("the old bridge", "wobbly"),
    ("riding a bike", "fast"), ("the waves", "big"), ("spiders", "creepy"), ("the first day of school", "new"),
    ("swimming", "deep"), ("the doctor", "strange"), ("loud fireworks", "loud"), ("the shadow under the bed", "dark"),
)

# (destination, how to get there, what is seen, what is done there)
TRIPS = (
    ("the seaside", "by train", ("boats bobbing in the harbor", "tall white lighthouses", "seagulls diving for fish"), "built sandcastles and looked for shells"),
    ("the zoo", "by bus", ("lions sleeping in the sun", "monkeys swinging on ropes", "a baby elephant"), "fed the goats and watched the penguins"),
    ("Grandma's farm", "in the car", ("fields of yellow corn", "a red barn", "cows by the fence"), "fed the chickens and rode on a tractor"),
    ("the mountains", "in the car", ("snowy tops", "tall pine trees", "a rushing waterfall"), "walked on a trail and ate lunch on a rock"),
    ("the fair", "by bus", ("a big wheel with lights", "tents with stripes", "balloons of every color"), "rode the carousel and ate cotton candy"),
    ("the museum", "by train", ("giant dinosaur bones", "old paintings", "a model of the moon"), "looked at the bones and drew pictures"),
    ("the aquarium", "by bus", ("sharks gliding by", "bright orange fish", "a giant turtle"), "touched a starfish and watched the seals"),
    ("the lake", "on their bikes", ("ducks on the water", "a wooden dock", "boats with sails"), "went fishing and skipped stones"),
    ("the big city", "by train", ("tall buildings", "busy streets", "a park with a fountain"), "visited a toy shop and rode an elevator"),
    ("the island", "on a boat", ("dolphins jumping", "palm trees", "white sand"), "swam in the warm water and found a crab"),
    ("the forest camp", "in the car", ("tall trees", "a little cabin", "a campfire ring"), "roasted marshmallows and listened to owls"),
    ("the apple orchard", "on a tractor", ("rows of apple trees", "baskets of apples", "a cider stand"), "picked apples and drank cider"),
    ("the snowy woods", "on a sled", ("snowy trees", "icicles on branches", "tracks of a fox"), "made snow angels and drank hot cocoa"),
    ("the space museum", "by train", ("a real rocket", "a big map of the stars", "a moon rock"), "sat in a pretend rocket and counted planets"),
)

TRIP_PROBLEMS = (
    ("the car got a flat tire", "a kind man helped change the tire"),
    ("it started to rain", "they found a big tree to stand under until the rain stopped"),
    ("they took a wrong turn", "a friendly lady showed them the right way"),
    ("the picnic basket was left at home", "they bought some bread and cheese at a little shop"),
    ("the bus was very late", "they played a counting game while they waited"),
    ("the map blew away in the wind", "they asked a park keeper for help"),
    ("a wheel fell off the wagon", "everyone helped to put it back"),
    ("they got very tired", "they sat down and had a snack until they felt strong again"),
)

# Who or what was really behind a misunderstanding.
MISUNDERSTANDING_CAUSES = (
    "the wind had blown it away", "a puppy had carried it off to play", "a bird had taken it to its nest",
    "it had fallen behind the couch", "a squirrel had hidden it with its nuts", "the rain had washed it away",
    "a little goat had nibbled on it", "it had rolled down the hill", "a cat had batted it under the bed",
    "a baby brother had put it in his toy box",
)

LESSON_MISTAKES = (
    ("climb the tall fence", "fell and scraped a knee", "it is important to listen when someone says something is not safe"),
    ("eat all the candy at once", "got a tummy ache", "too much candy is not good for you"),
    ("run near the pond", "slipped and fell in the mud", "you must be careful near water"),
    ("skip brushing teeth", "had a sore tooth", "you should brush your teeth every day"),
    ("play with the paint without asking", "made a big mess on the floor", "you should ask before you take something"),
    ("stay up very late", "was too sleepy to play the next day", "rest is important"),
    ("take the biggest piece of cake", "made a friend sad", "sharing makes everyone happy"),
    ("go out without a coat", "got very cold and shivered", "it is wise to listen to good advice"),
    ("rush through the puzzle", "lost all the pieces", "slow and careful is better than fast and messy"),
    ("tease the little puppy", "made the puppy cry", "you must be gentle with everyone"),
    ("leave the toys on the stairs", "tripped over a toy truck", "you should put your toys away after playing"),
    ("keep a secret from Mom", "felt bad all day", "telling the truth always feels better"),
)

GIFTS = (
    "a painted card", "a crown made of flowers", "a little clay pot", "a drawing of a rainbow",
    "a bracelet of beads", "a box of cookies", "a paper boat", "a song about friends",
    "a picture frame made of sticks", "a basket of berries", "a kite with a long tail", "a scarf",
    "a jar of shiny stones", "a little wooden bird", "a bunch of wildflowers", "a hand-made book",
)

OCCASIONS = (
    "birthday", "first day at a new school", "big race", "garden show", "special day",
    "last day before moving away", "tea party", "school play",
)

SOUNDS = ("a loud bang", "a soft crying sound", "a strange squeak", "a tiny voice", "a rustle in the bushes", "a splash")

CLOSING_LINES = (
    "And they lived happily ever after.",
    "From that day on, they were the best of friends.",
    "It was the best day ever.",
    "That night, {hero} fell asleep with a big smile.",
    "{hero} would never forget that day.",
    "And every day after that was a little bit brighter.",
    "The sun went down, and everyone went home happy.",
    "The end.",
)

# Things a character loves to do, in the base form that fits "loved to ...".
LOVES = (
    "play outside", "sing songs", "look at the clouds", "run fast", "read books", "paint pictures",
    "dance", "climb trees", "splash in puddles", "build things", "help others", "tell stories",
    "jump rope", "dig in the sand", "watch the birds", "make new friends", "play games",
    "eat sweet fruit", "explore", "draw funny faces", "play music", "swim", "count the stars",
    "pick flowers", "bake with Mom", "ride a bike", "hum little tunes", "collect shiny things",
    "plant seeds", "feed the birds", "dress up in funny clothes", "skip stones on the water",
    "make up songs", "look for bugs under rocks", "do cartwheels", "whistle", "visit Grandma",
    "splash in the bath", "ask lots of questions", "watch the trains go by", "make sandcastles",
    "play with blocks", "chase butterflies", "laugh", "roll in the grass", "fly kites",
)

# Creatures that can get stuck or hurt and need rescuing: (who, the trouble, how it was solved)
RESCUES = (
    ("a little kitten", "was stuck high up in a tree", "held out a soft blanket, and the kitten climbed down slowly onto a low branch and jumped into it"),
    ("a baby bird", "had fallen out of its nest", "gently lifted the bird in a soft hat and put it back in the nest"),
    ("a small duckling", "had lost its mother", "followed the quacking sounds to the pond, where the mother duck was waiting"),
    ("a tiny turtle", "was stuck on its back", "carefully turned the turtle over so it could walk again"),
    ("a puppy", "had its paw caught in a fence", "wiggled the fence wire loose so the puppy could pull its paw free"),
    ("a little bee", "was caught in a spider web", "used a long stick to free the bee without hurting it"),
    ("a young squirrel", "could not reach its nuts on the other side of the stream", "put a long branch across the water like a little bridge"),
    ("a lost lamb", "could not find the way back to the farm", "walked with the lamb all the way back to the farmer"),
    ("a small frog", "was stuck in an empty bucket", "tipped the bucket over so the frog could hop out"),
    ("a little mouse", "was trapped under a heavy box", "pushed the heavy box until the mouse could run out"),
)

CLOTHES = (
    "raincoat", "sweater", "dress", "jacket", "vest", "skirt", "cap", "sun hat", "bow tie",
    "apron", "cardigan", "hoodie", "tutu", "poncho", "beanie", "bandana", "beret", "coat",
    "shirt", "scarf", "overalls", "pajamas", "cape", "party hat", "woolly hat", "bathrobe",
    "tracksuit", "jumper", "blouse", "waistcoat", "cloak", "nightgown", "kimono", "smock",
)
FOOTWEAR = ("boots", "sneakers", "sandals", "slippers", "rain boots", "shoes", "socks", "flip-flops", "wellies")
PATTERNS = ("with white dots", "with blue stripes", "with tiny stars", "with a big pocket", "with shiny buttons",
            "with a picture of a rocket", "with yellow flowers", "with a hood", "with a zipper", "with little hearts")

# Where a character lives, as phrases that fit "lived in ...", by kind of character.
CHILD_HOMES = (
    "a little house with a red door", "a tall blue house on a hill", "a cozy cottage by the sea",
    "a small flat above a bakery", "a farmhouse at the end of a dusty road", "a yellow house with a big garden",
    "a tiny cabin in the woods", "a white house next to the school", "a house made of bricks near the market",
    "an old windmill", "a houseboat on the canal", "a lighthouse by the rocky shore", "a green house with a round window",
)
ANIMAL_HOMES = (
    "a burrow under an old oak", "a nest at the top of a tall tree", "a hollow log near the pond",
    "a basket by the kitchen fire", "a barn full of warm hay", "a cozy den under the roots of a tree",
    "a little hut at the edge of the field", "a hole in the garden wall",
)
TOY_HOMES = (
    "a box full of soft blankets", "a toy chest in a child's bedroom", "a corner of a busy toy shop",
    "a basket under the bed", "a dollhouse in the playroom", "a drawer full of socks",
)

# Short scene-setting sentences, complete on their own.
SKY_LINES = (
    "The sky was blue, and the birds were singing.", "Big fluffy clouds floated across the sky.",
    "The sun was warm and bright.", "A soft breeze made the leaves dance.", "Little drops of rain tapped on the windows.",
    "The air smelled like flowers and fresh grass.", "Snowflakes drifted down like tiny feathers.",
    "The wind whistled through the trees.", "A rainbow stretched across the sky.", "Puddles sparkled after the rain.",
    "The grass was wet with morning dew.", "Golden leaves crunched on the path.",
    "The moon was already peeking over the rooftops.", "Bees hummed busily in the sunshine.",
    "Thunder grumbled far away, but the sun was still shining.", "Frost made the windows glitter.",
)

# Looks, as phrases that fit "had ...".
CHILD_LOOKS = (
    "curly red hair", "long brown braids", "short black hair", "golden curls", "freckles on both cheeks",
    "a gap between two front teeth", "big round glasses", "a bright smile", "rosy cheeks",
    "a bouncy ponytail", "spiky hair that stuck up", "dark eyes that sparkled", "a button nose",
)
ANIMAL_LOOKS = (
    "soft fluffy fur", "a long bushy tail", "big floppy ears", "shiny whiskers", "tiny paws",
    "a spotted coat", "a stripy tail", "a wet black nose", "bright green eyes", "a pink nose",
)
TOY_LOOKS = (
    "a missing button", "shiny painted eyes", "a patch on one arm", "a tiny key in the back",
    "wheels that squeaked", "a little bow tie", "stitches that showed love",
)

# Foods that can be carried in a basket and shared by hand (no drinks, no soups).
_NOT_PORTABLE = {
    "soup", "warm soup", "lemonade", "juice", "milk", "hot cocoa", "porridge", "yogurt", "ice cream",
    "scrambled eggs", "rice", "noodles", "chocolate pudding", "peas", "corn",
}
SNACKS = tuple(food for food in FOODS if food not in _NOT_PORTABLE)

QUIET_SOUNDS = ("a soft crying sound", "a tiny voice", "a quiet sniffle", "someone humming a sad song")
