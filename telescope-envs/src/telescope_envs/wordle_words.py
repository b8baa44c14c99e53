"""The builtin Wordle secret words: 137 common five-letter English nouns (a fixed order)."""

WORDS: tuple[str, ...] = (
    "apple", "beach", "bread", "brick", "chair", "chalk", "cloud", "crane", "dance", "drink", "eagle", "earth",
    "field", "flame", "fruit", "ghost", "glass", "grape", "grass", "heart", "horse", "house", "juice", "knife",
    "lemon", "light", "money", "mouse", "music", "night", "ocean", "paint", "paper", "party", "piano", "pilot",
    "plant", "plate", "queen", "radio", "river", "robot", "salad", "sheep", "shirt", "shoes", "smile", "snake",
    "space", "spoon", "storm", "sugar", "table", "tiger", "toast", "tooth", "train", "truck", "water", "whale",
    "wheel", "world", "zebra", "bacon", "badge", "blade", "blank", "block", "board", "brain", "brush", "cabin",
    "candy", "chain", "cheek", "chest", "chief", "clock", "coast", "couch", "cream", "crown", "dream", "dress",
    "drive", "fence", "flour", "frame", "glove", "grain", "honey", "hotel", "image", "jelly", "koala", "laser",
    "lunch", "magic", "maple", "metal", "motor", "nurse", "olive", "onion", "otter", "pasta", "peach", "pearl",
    "phone", "pizza", "plain", "pride", "quilt", "raven", "rider", "rifle", "scarf", "shelf", "skirt", "slope",
    "sound", "stamp", "steam", "stone", "straw", "sweet", "thumb", "towel", "tower", "trail", "vapor", "voice",
    "wagon", "watch", "wrist", "yacht", "youth",
)
