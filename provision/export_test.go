package provision

// For the tests of package provision_test.
var ScramVerifier = scramVerifier

const (
	ChosenPasswordIterations    = chosenPasswordIterations
	GeneratedPasswordIterations = generatedPasswordIterations
)

var RuntimeTLS = runtimeTLS
