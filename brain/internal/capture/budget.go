package capture

import (
	"n8nbrain/brain/internal/model"
)

// estimateTokens is a deliberately high estimate of a chat's prompt
// tokens, made before the call. Tokenizers of the models we run average 3.5
// to 4.5 bytes of UTF-8 a token on English prose and about 3 on JSON,
// escapes and most other scripts (a CJK character is 3 bytes and usually a
// token), so one token per 3 bytes of message text, plus 10 tokens of
// chat-template framing per message, errs on the side of refusing a call
// the budget might just have covered. The JSON schema given as the format
// constrains sampling and is not part of the prompt.
func estimateTokens(msgs []model.Message) int64 {
	var n int64
	for _, m := range msgs {
		n += int64(len(m.Content)+2)/3 + 10
	}
	return n
}
