import Testing
@testable import GatehouseSignIn
