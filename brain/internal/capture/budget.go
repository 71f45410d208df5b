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

// noPredictLimit is the output allowance of a call whose options bound
// output by neither num_predict nor num_ctx: no model we run has a larger
// context than this.
const noPredictLimit = 32768

// outputAllowance is the most output a call with these options may
// produce: num_predict when positive; otherwise Ollama bounds it only by
// the context (num_predict -1 is unlimited, -2 fills the context), so
// num_ctx, or noPredictLimit.
func outputAllowance(opts map[string]any) int64 {
	if n, ok := number(opts["num_predict"]); ok && n > 0 {
		return n
	}
	if n, ok := number(opts["num_ctx"]); ok && n > 0 {
		return n
	}
	return noPredictLimit
}

// number reads a whole number from an option value: ours are ints, the
// registry's (decoded JSON) float64s.
func number(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case float64:
		if x >= -1e15 && x <= 1e15 {
			return int64(x), true
		}
	}
	return 0, false
}
